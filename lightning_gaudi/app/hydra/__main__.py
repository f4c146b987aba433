"""A rank process of the Hydra rank launcher: ``python -m lightning_gaudi.app.hydra RANK_CONFIG MODULE:FUNCTION``."""

import sys

from lightning_gaudi.app.hydra.ranks import main

sys.exit(main(sys.argv[1:]))
