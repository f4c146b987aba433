"""Variable-length sequences padded to a few bucket lengths: one compiled graph per bucket, bounded padding."""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

__all__ = ["BucketedPadCollate"]


def _is_sequence(value: Any) -> bool:
    return value.dim() == 1 if isinstance(value, Tensor) else isinstance(value, (list, tuple))


class BucketedPadCollate:
    """A ``collate_fn`` that pads a batch of tokenizer outputs to the smallest bucket length that holds it (each
    sequence key its own); per-sample values are stacked, ``attention_mask`` is created when missing.

    Args:
        buckets: the padded lengths, e.g. ``[64, 128, 256, 512]`` (see :meth:`quantile_buckets`).
        pad_token_id, label_pad_token_id: what pads ``input_ids`` and per-token ``labels``.
        padding_side: ``"right"`` or ``"left"``.
        truncate: cut sequences longer than the largest bucket instead of raising.
        sequence_keys: the keys to pad; by default every key whose value is a list or a 1-D tensor.
        pad_values: pad values for other keys, e.g. ``{"token_type_ids": 0, "position_ids": 0}``.
    """

    def __init__(
        self,
        buckets: Sequence[int],
        pad_token_id: int = 0,
        label_pad_token_id: int = -100,
        padding_side: Literal["right", "left"] = "right",
        truncate: bool = False,
        sequence_keys: Sequence[str] | None = None,
        pad_values: Mapping[str, int | float] | None = None,
    ) -> None:
        values = list(buckets) if isinstance(buckets, Sequence) and not isinstance(buckets, str) else None
        if not values or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in values):
            raise ValueError(
                f"`buckets={buckets!r}` must be a non-empty list of positive lengths, e.g. [64, 128, 256, 512]."
            )
        if padding_side not in ("right", "left"):
            raise ValueError(f"`padding_side={padding_side!r}` must be 'right' or 'left'.")
        self.buckets = sorted(set(values))
        self.pad_token_id = pad_token_id
        self.label_pad_token_id = label_pad_token_id
        self.padding_side = padding_side
        self.truncate = truncate
        self.sequence_keys = tuple(sequence_keys) if sequence_keys is not None else None
        defaults = {"input_ids": pad_token_id, "labels": label_pad_token_id, "attention_mask": 0}
        self.pad_values: dict[str, int | float] = {**defaults, **(pad_values or {})}

    def bucket_length(self, length: int) -> int:
        """The smallest bucket not shorter than ``length`` (the largest under ``truncate``, else ``ValueError``)."""
        index = bisect.bisect_left(self.buckets, length)
        if index < len(self.buckets):
            return self.buckets[index]
        if self.truncate:
            return self.buckets[-1]
        raise ValueError(
            f"A sequence of {length} tokens is longer than the largest bucket ({self.buckets[-1]}, buckets"
            f" {self.buckets}). Add a larger bucket, truncate the data when tokenizing, or pass truncate=True."
        )

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Tensor]:
        if not samples:
            raise ValueError("BucketedPadCollate got an empty batch.")
        keys = list(samples[0])
        for sample in samples[1:]:
            if list(sample) != keys:
                raise ValueError(f"All samples of a batch need the same keys; got {keys} and {list(sample)}.")
        wanted = self.sequence_keys
        sequence_keys = [k for k in keys if (k in wanted if wanted is not None else _is_sequence(samples[0][k]))]
        batch: dict[str, Tensor] = {}
        for key in keys:
            values = [sample[key] for sample in samples]
            pad = key in sequence_keys
            batch[key] = self._pad(key, values) if pad else torch.stack([torch.as_tensor(v) for v in values])
        if "attention_mask" not in batch and "input_ids" in sequence_keys:
            lengths = [len(sample["input_ids"]) for sample in samples]
            batch["attention_mask"] = self._pad("attention_mask", [[1] * n for n in lengths])
        return batch

    def _pad(self, key: str, values: Sequence[Any]) -> Tensor:
        tensors = [torch.as_tensor(v) for v in values]
        longest = max(t.shape[0] for t in tensors)
        length = self.bucket_length(longest)
        dtype = next((t.dtype for t in tensors if t.numel()), torch.long)
        out = torch.full((len(tensors), length), self.pad_values.get(key, 0), dtype=dtype)
        for row, tensor in enumerate(tensors):
            tensor = tensor[:length]
            if self.padding_side == "right":
                out[row, : tensor.shape[0]] = tensor
            else:
                out[row, length - tensor.shape[0] :] = tensor
        return out

    @staticmethod
    def quantile_buckets(lengths: Sequence[int], count: int, multiple_of: int = 8) -> list[int]:
        """``count`` bucket lengths at the quantiles of the data's sequence ``lengths`` (the last its longest), each
        rounded up to a multiple of ``multiple_of``. Batches land in the upper buckets more often than samples do."""
        if not lengths or count < 1 or multiple_of < 1:
            raise ValueError(
                f"quantile_buckets needs lengths, count >= 1 and multiple_of >= 1; got {len(lengths)} lengths,"
                f" count={count}, multiple_of={multiple_of}."
            )
        ordered = sorted(lengths)
        picks = [ordered[min(len(ordered) - 1, math.ceil(len(ordered) * i / count) - 1)] for i in range(1, count + 1)]
        return sorted({multiple_of * math.ceil(p / multiple_of) for p in picks})
