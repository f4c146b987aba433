"""Models for the examples."""

from lightning_gaudi.models.gpt import GPT, GPTLanguageModel

__all__ = ["GPT", "GPTLanguageModel"]
