"""BucketedPadCollate: padding to a few bucket lengths, and what it does to graph compilations."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from helpers.hf_style import HFStyleClassifier, pad_to_longest, token_loader, token_samples
from helpers.workload import quiet_trainer

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import GraphDiagnostics, HPUCompile
from lightning_gaudi.data import BucketedPadCollate


def test_pads_to_the_smallest_bucket_with_masks_and_label_padding() -> None:
    collate = BucketedPadCollate(buckets=[16, 8], pad_token_id=1)
    batch = collate(
        [
            {"input_ids": [5, 6, 7], "token_type_ids": [0, 0, 1], "labels": [5, 6, 7]},
            {
                "input_ids": torch.tensor([8, 9, 10, 11, 12]),
                "token_type_ids": [0, 1, 1, 1, 1],
                "labels": [8, 9, 10, 11, 12],
            },
        ]
    )
    assert collate.buckets == [8, 16]
    assert batch["input_ids"].tolist() == [[5, 6, 7, 1, 1, 1, 1, 1], [8, 9, 10, 11, 12, 1, 1, 1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]]
    assert batch["labels"].tolist()[0] == [5, 6, 7, -100, -100, -100, -100, -100]
    assert batch["token_type_ids"].tolist()[1] == [0, 1, 1, 1, 1, 0, 0, 0]
    assert batch["input_ids"].dtype == torch.long


def test_per_sample_labels_left_padding_and_a_given_mask() -> None:
    collate = BucketedPadCollate(buckets=[4, 8], padding_side="left")
    batch = collate(
        [
            {"input_ids": [1, 2], "attention_mask": [1, 1], "labels": 2},
            {"input_ids": [3, 4, 5, 6, 7], "attention_mask": [1, 1, 1, 1, 0], "labels": 0},
        ]
    )
    assert batch["input_ids"].tolist() == [[0, 0, 0, 0, 0, 0, 1, 2], [0, 0, 0, 3, 4, 5, 6, 7]]
    assert batch["attention_mask"].tolist() == [[0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 1, 1, 0]]
    assert batch["labels"].tolist() == [2, 0]


def test_too_long_raises_or_truncates() -> None:
    with pytest.raises(ValueError, match=r"9 tokens is longer than the largest bucket \(8.*truncate=True"):
        BucketedPadCollate(buckets=[4, 8])([{"input_ids": list(range(9))}])
    batch = BucketedPadCollate(buckets=[4, 8], truncate=True)([{"input_ids": list(range(9))}])
    assert batch["input_ids"].tolist() == [list(range(8))]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"buckets": []}, "non-empty list of positive lengths"),
        ({"buckets": [0, 8]}, "non-empty list of positive lengths"),
        ({"buckets": [8], "padding_side": "middle"}, "'right' or 'left'"),
    ],
)
def test_bad_settings(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BucketedPadCollate(**kwargs)


def test_mismatched_samples_and_quantile_buckets() -> None:
    with pytest.raises(ValueError, match="same keys"):
        BucketedPadCollate(buckets=[8])([{"input_ids": [1]}, {"input_ids": [1], "labels": 0}])
    lengths = [3, 4, 5, 6, 7, 20, 21, 40]
    assert BucketedPadCollate.quantile_buckets(lengths, count=2) == [8, 40]
    assert BucketedPadCollate.quantile_buckets(lengths, count=4, multiple_of=4) == [4, 8, 20, 40]


def _compilations(collate: Any, samples: list[dict[str, Any]]) -> dict[str, Any]:
    diagnostics = GraphDiagnostics(warmup_steps=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = quiet_trainer(callbacks=[diagnostics, HPUCompile(dynamic=False)])
        trainer.fit(HFStyleClassifier(), token_loader(samples, batch_size=2, collate_fn=collate))
    return diagnostics.summary


def test_bucketing_bounds_compilations_by_the_buckets(eager_hpu: hpu.Backend) -> None:
    """Lengths 3 to 16 in batches of 2 (per-batch padding: 14 shapes, past the recompile limit of 8; see
    tests/callbacks/test_diagnostics.py); two buckets: two shapes, two graphs."""
    samples = [sample for length in range(3, 17) for sample in token_samples(2, length, length, seed=length)]
    assert len({pad_to_longest(samples[i : i + 2])["input_ids"].shape for i in range(0, len(samples), 2)}) == 14
    torch.compiler.reset()
    bucketed = _compilations(BucketedPadCollate(buckets=[8, 16]), samples)
    torch.compiler.reset()
    assert bucketed["distinct_input_shapes"] == 2
    assert bucketed["graph_compilations_in_warmup"] + bucketed["graph_compilations_after_warmup"] == 2
    assert bucketed["recompile_limit_hit"] is False
