"""Data modules for the examples."""

from lightning_gaudi.data.stdlib_text import StdlibTextDataModule

__all__ = ["StdlibTextDataModule"]
