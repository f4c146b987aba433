"""A rank process of the Hydra rank launcher: ``python -m lightning_gaudi.hydra RANK_CONFIG.yaml MODULE:FUNCTION``."""

import sys

from lightning_gaudi.hydra.ranks import main

sys.exit(main(sys.argv[1:]))
