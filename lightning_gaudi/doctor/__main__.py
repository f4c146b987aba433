"""``python -m lightning_gaudi.doctor``: see :mod:`lightning_gaudi.doctor`."""

import sys

from lightning_gaudi.doctor import main

sys.exit(main())
