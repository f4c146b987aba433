"""The Hydra schemas come from the classes' signatures: a schema's defaults build the same object as the class's own
defaults, every override names a real argument, and the recipes under conf/ repeat no default."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, List, Literal, Optional  # noqa: UP035 - what OmegaConf reads

import pytest
import yaml
from helpers.configs import CONF_DIR
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lightning_gaudi import HPUParallelStrategy, Runtime, callbacks, hpu
from lightning_gaudi.app.hydra import schemas
from lightning_gaudi.profilers import HPUProfiler

SCHEMAS = schemas.schemas()


def _public_state(obj: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(obj).items() if not k.startswith("_") and not callable(v)}


@pytest.mark.parametrize("path", sorted(p for p in SCHEMAS if not p.startswith("hydra/")))
def test_schema_defaults_build_what_the_class_defaults_build(path: str, eager_hpu: Any) -> None:
    if "deepspeed" in path and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("DeepSpeed is not installed (pip install '.[deepspeed]')")
    node = OmegaConf.structured(SCHEMAS[path])
    built = instantiate(node, _convert_="all")
    target = type(built)
    plain = target()
    if isinstance(built, HPUParallelStrategy):
        assert built.ddp_kwargs == plain.ddp_kwargs
        assert built.timeout == plain.timeout
        assert built._start_method == plain._start_method
    elif isinstance(built, Runtime):
        assert built == plain
    elif isinstance(built, HPUProfiler):
        assert _public_state(built) == _public_state(plain)
        assert built._profiler_kwargs.keys() - plain._profiler_kwargs.keys() <= set(_FORWARDED_TO_TORCH)
        for key, value in plain._profiler_kwargs.items():
            if key not in ("schedule", "on_trace_ready"):  # a new schedule object and bound method per profiler
                assert built._profiler_kwargs[key] == value, key
    else:
        assert _public_state(built) == _public_state(plain)


def test_strategy_timeout_is_seconds_in_the_config() -> None:
    node = OmegaConf.structured(SCHEMAS["strategy/hpu_parallel"])
    assert node.timeout == 600.0
    assert OmegaConf.get_type(node, "timeout") is float
    node.timeout = 42
    assert instantiate(node).timeout == timedelta(seconds=42)


def test_every_override_names_a_real_argument() -> None:
    for (target, name), override in schemas.OVERRIDES.items():
        assert name in schemas.config_defaults(target), f"{target.__name__} has no argument {name!r} any more"
        assert override.doc


#: What HPUProfiler forwards to torch.profiler.profile, as its schema offers it.
_FORWARDED_TO_TORCH = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")


def test_profiler_schema_offers_what_the_profiler_forwards_with_the_receivers_defaults() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(SCHEMAS["profiler/hpu"])}
    assert fields["_target_"] == "lightning_gaudi.profilers.HPUProfiler"
    assert {k: fields[k] for k in ("dirpath", "filename", "wait_steps", "active_steps", "row_limit")} == {
        "dirpath": None,
        "filename": None,
        "wait_steps": 3,
        "active_steps": 5,
        "row_limit": 20,
    }
    assert dict.fromkeys(_FORWARDED_TO_TORCH, False).items() <= fields.items()
    assert {k: fields[k] for k in ("group_by_input_shapes", "export_to_chrome", "record_module_names")} == {
        "group_by_input_shapes": False,
        "export_to_chrome": True,
        "record_module_names": True,
    }
    for receiver, names in schemas.FORWARDED[HPUProfiler]:
        assert set(names) <= set(inspect.signature(receiver).parameters), f"{receiver.__qualname__} changed"


def test_profiler_forwarded_settings_reach_torchs_profiler(eager_hpu: hpu.Backend) -> None:
    node = OmegaConf.structured(SCHEMAS["profiler/hpu"])
    node.record_shapes = True
    node.wait_steps = 1
    node.export_to_chrome = False
    built = instantiate(node)
    assert isinstance(built, HPUProfiler)
    assert built.wait_steps == 1
    assert built._profiler_kwargs["record_shapes"] is True
    assert built._export_to_chrome is False
    with pytest.raises(Exception, match="Value 'often' is not a valid bool"):
        node.profile_memory = "often"
    with pytest.raises(Exception, match="could not be converted to Integer"):
        node.active_steps = "few"


def test_every_plugin_callback_has_a_schema_and_a_recipe() -> None:
    exported = {name for name in callbacks.__all__ if isinstance(getattr(callbacks, name), type)}
    assert set(schemas.CALLBACK_CONFIG_NAMES.values()) == exported
    for config_name in schemas.CALLBACK_CONFIG_NAMES:
        assert (CONF_DIR / "callbacks" / f"{config_name}.yaml").is_file()


def test_schemas_check_types() -> None:
    mark_step = OmegaConf.structured(SCHEMAS["callbacks/mark_step"])
    with pytest.raises(Exception, match="Value 'often' is not a valid bool"):
        mark_step.after_backward = "often"
    runtime = OmegaConf.structured(SCHEMAS["runtime"])
    runtime.autocast_bf16_ops = ["linear"]
    assert OmegaConf.to_container(runtime)["autocast_bf16_ops"] == ["linear"]
    with pytest.raises(Exception, match="could not be converted to Integer"):
        runtime.emulated_devices = "two"


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (int, int),
        (bool | None, Optional[bool]),  # noqa: UP045
        (Literal["lazy", "eager"] | None, Optional[str]),  # noqa: UP045
        (Sequence[str] | None, Optional[List[str]]),  # noqa: UP006, UP045
        (tuple[str, ...], List[str]),  # noqa: UP006
        (tuple[str, int], Any),
        (timedelta | float | None, Any),
        (dict[str, int], Any),
    ],
)
def test_omegaconf_type(annotation: Any, expected: Any) -> None:
    assert schemas.omegaconf_type(annotation) == expected


def _recipe_values(path: str) -> dict[str, Any]:
    """The values a recipe sets itself for the node its schema fills (without the defaults list)."""
    raw = yaml.safe_load((CONF_DIR / f"{path}.yaml").read_text()) or {}
    raw.pop("defaults", None)
    group = path.split("/")[0]
    if group == "callbacks":
        return raw.get(path.split("/")[1], {}) or {}
    return raw


@pytest.mark.parametrize(
    "path",
    [
        *(f"callbacks/{name}" for name in schemas.CALLBACK_CONFIG_NAMES),
        "strategy/hpu_parallel",
        "strategy/hpu_single",
        "profiler/hpu",
    ],
)
def test_recipes_hold_only_real_deviations(path: str) -> None:
    defaults = {f.name: f for f in dataclasses.fields(SCHEMAS[path])}
    for key, value in _recipe_values(path).items():
        assert key in defaults, f"conf/{path}.yaml sets {key!r}, which its schema lacks"
        schema_field = defaults[key]
        default = schema_field.default_factory() if callable(schema_field.default_factory) else schema_field.default
        assert value != default, f"conf/{path}.yaml repeats the default {key}={value!r}; leave it to the class"


def test_runtime_recipe_sets_nothing() -> None:
    assert set(_recipe_values("runtime/default")) == set()


def test_the_parallel_strategy_schema_has_the_ddp_knobs() -> None:
    assert {f.name for f in dataclasses.fields(SCHEMAS["strategy/hpu_parallel"])} >= {
        "bucket_cap_mb",
        "gradient_as_bucket_view",
        "static_graph",
        "find_unused_parameters",
        "broadcast_buffers",
        "process_group_backend",
        "timeout",
        "start_method",
    }
