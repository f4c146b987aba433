"""A LitGPT pretraining data module on local ``.txt`` files that needs no download and no ``litdata``.

LitGPT's own ``TextFiles`` module preprocesses through ``litdata`` (an optional package that pulls another torch);
this one reads the files into memory, tokenizes them with the model's tokenizer and serves fixed-length windows the
way ``TextFiles`` does (``max_seq_length + 1`` tokens each, the last one the next token's target). The tests pass it
to ``litgpt pretrain --data helpers.litgpt_text.LocalText --data.train_data_path DIR``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from litgpt.data import DataModule
from litgpt.tokenizer import Tokenizer
from torch import Tensor
from torch.utils.data import DataLoader, Dataset


class _Windows(Dataset):
    def __init__(self, tokens: Tensor, length: int) -> None:
        self.tokens, self.length = tokens, length

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.length

    def __getitem__(self, index: int) -> Tensor:
        return self.tokens[index * self.length : (index + 1) * self.length + 1]


class _Loader(DataLoader):
    """A loader with the ``state_dict`` LitGPT's checkpoints expect of one (``litdata``'s has it): without one, Fabric
    would pickle the loader itself into ``lit_model.pth``, which ``torch.load(weights_only=True)`` then refuses."""

    def state_dict(self) -> dict[str, int]:
        return {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        pass


@dataclass
class LocalText(DataModule):
    """Windows of the tokenized ``*.txt`` files of ``train_data_path`` (the first file, sorted, is validation)."""

    train_data_path: Path
    tokenizer: Tokenizer | None = field(default=None, init=False, repr=False)
    batch_size: int = field(default=1, init=False, repr=False)
    max_seq_length: int = field(default=-1, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__init__()

    def connect(self, tokenizer: Tokenizer | None = None, batch_size: int = 1, max_seq_length: int = -1) -> None:
        self.tokenizer, self.batch_size, self.max_seq_length = tokenizer, batch_size, max_seq_length

    def _tokens(self, files: list[Path]) -> Tensor:
        assert self.tokenizer is not None, "pass --tokenizer_dir"
        text = [self.tokenizer.encode(f.read_text().strip(), bos=True).long() for f in files]
        return torch.cat(text)

    def _loader(self, files: list[Path], shuffle: bool) -> DataLoader:
        dataset = _Windows(self._tokens(files), self.max_seq_length)
        generator = torch.Generator().manual_seed(42)
        return _Loader(dataset, batch_size=self.batch_size, shuffle=shuffle, generator=generator, drop_last=True)

    def train_dataloader(self) -> DataLoader:
        return self._loader(sorted(Path(self.train_data_path).glob("*.txt"))[1:], shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(sorted(Path(self.train_data_path).glob("*.txt"))[:1], shuffle=False)
