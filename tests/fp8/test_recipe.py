"""The FP8 recipe: defaults in one place, bad values refused with the fix."""

from __future__ import annotations

import pytest

from lightning_gaudi.fp8 import E4M3, E5M2, FP8Recipe


def test_defaults_follow_transformer_engines_delayed_scaling() -> None:
    recipe = FP8Recipe()
    assert recipe.as_dict() == {
        "format": "hybrid",
        "amax_history_len": 1024,
        "margin": 0,
        "amax_compute_algo": "max",
        "interval": 1,
    }
    assert (recipe.forward_format, recipe.backward_format) == (E4M3, E5M2)
    assert FP8Recipe(format="e4m3").backward_format == E4M3
    assert FP8Recipe(format="HYBRID").format == "hybrid"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"format": "e5m2"}, r"format='e5m2'; use 'hybrid' \(E4M3 forward, E5M2 gradients\) or 'e4m3'"),
        ({"format": None}, "format=None"),
        ({"amax_history_len": 0}, "amax_history_len=0; it must be an integer >= 1"),
        ({"amax_history_len": 2.5}, "amax_history_len=2.5"),
        ({"margin": -1}, "margin=-1; it must be an integer >= 0"),
        ({"interval": 0}, "interval=0"),
        ({"interval": True}, "interval=True"),
        ({"amax_compute_algo": "mean"}, "amax_compute_algo='mean'; use 'max' or 'most_recent'"),
    ],
)
def test_bad_values_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FP8Recipe(**kwargs)


def test_coerce() -> None:
    assert FP8Recipe.coerce(None) == FP8Recipe()
    recipe = FP8Recipe(margin=1)
    assert FP8Recipe.coerce(recipe) is recipe
    assert FP8Recipe.coerce({"amax_history_len": 16, "format": "e4m3"}) == FP8Recipe(format="e4m3", amax_history_len=16)
    with pytest.raises(ValueError, match=r"no field\(s\) \['history'\]"):
        FP8Recipe.coerce({"history": 16})
    with pytest.raises(TypeError, match="not str"):
        FP8Recipe.coerce("hybrid")  # type: ignore[arg-type]
