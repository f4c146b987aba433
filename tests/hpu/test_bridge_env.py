"""The bridge's variables read as Intel's bridge reads them (gaudi-pytorch-bridge v1.19.0, commit 5a56187e9868):
``PT_HPU_RECIPE_CACHE_CONFIG`` field by field, ``PT_HPU_LAZY_MODE`` and ``PT_ENABLE_INT64_SUPPORT``; a value the
bridge would stop on or read otherwise than meant is refused before anything starts, naming the variable."""

from __future__ import annotations

import os
import sys
from types import ModuleType

import pytest
from helpers.workload import Workload, loader, quiet_trainer

from lightning_gaudi import hpu
from lightning_gaudi.hpu import runtime
from lightning_gaudi.hpu.runtime import INT64_ENV, LAZY_MODE_ENV, RECIPE_CACHE_ENV, RecipeCache, Runtime, configure

#: The deprecated variables a missing recipe-cache field leaves in force (recipe_cache_config.cpp:74-101).
RECIPE_CACHE_DELETE_ENV = "PT_CACHE_FOLDER_DELETE"
RECIPE_CACHE_SIZE_ENV = "PT_CACHE_FOLDER_SIZE_MB"

#: Intel's runtime-flags page documents 4 fields: <path>,<delete true|false>,<max size MB>,<on_nfs true|false>.
FOUR_FIELDS = "/tmp/recipes,false,1024,true"


@pytest.fixture
def env(isolated_env: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (LAZY_MODE_ENV, INT64_ENV, RECIPE_CACHE_ENV, RECIPE_CACHE_DELETE_ENV, RECIPE_CACHE_SIZE_ENV):
        isolated_env.delenv(name, raising=False)
    return isolated_env


# --- PT_HPU_RECIPE_CACHE_CONFIG ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fields"),
    [
        # 1 to 3 fields, the missing ones the bridge's defaults (recipe_cache_config.cpp:59-96; defaults
        # scripts/env_flags.yaml:715-723: size 1024, delete false)
        ("/tmp/recipes", ("/tmp/recipes", False, 1024, False)),
        ("/tmp/recipes,true", ("/tmp/recipes", True, 1024, False)),
        # the documented 4th field (Intel's current runtime-flags page)
        (FOUR_FIELDS, ("/tmp/recipes", False, 1024, True)),
        # an empty field keeps the default (recipe_cache_config.cpp:75-77, 84-86)
        ("/tmp/recipes,,2048", ("/tmp/recipes", False, 2048, False)),
        # std::getline drops the empty field after a trailing comma (recipe_cache_config.cpp:104-113)
        ("/tmp/recipes,true,", ("/tmp/recipes", True, 1024, False)),
        # an empty path: no disk cache (env_flags.yaml:70-71)
        (",true", ("", True, 1024, False)),
        # booleans in any case, 1/0 too (env_flags.cpp:261-281)
        ("/tmp/recipes,TRUE,512,False", ("/tmp/recipes", True, 512, False)),
        ("/tmp/recipes,1,512,0", ("/tmp/recipes", True, 512, False)),
        # 0 MB: no eviction (cache_file_handler.h:67-70); a 0x prefix is hexadecimal (env_flags.cpp:325-337)
        ("/tmp/recipes,false,0", ("/tmp/recipes", False, 0, False)),
        ("/tmp/recipes,false,0x400", ("/tmp/recipes", False, 1024, False)),
    ],
)
def test_recipe_cache_values_the_bridge_accepts(
    env: pytest.MonkeyPatch, value: str, fields: tuple[str, bool, int, bool]
) -> None:
    path, delete_on_start, max_size_mb, on_nfs = fields
    expected = RecipeCache(path, delete_on_start, max_size_mb, on_nfs=on_nfs)
    assert RecipeCache.parse(value) == expected
    env.setenv(RECIPE_CACHE_ENV, value)
    assert Runtime.from_env().recipe_cache == expected


@pytest.mark.parametrize(
    ("value", "accepts"),
    [
        ("/tmp/r,true,1024,false,x", "takes 1 to 4"),  # recipe_cache_config.cpp:60-62 asserts at most 3 (4 now)
        ("/tmp/r,maybe", "accepts 1, true, 0 or false"),  # env_flags.cpp:272-278: fatal
        ("/tmp/r, true", "accepts 1, true, 0 or false"),  # no space trimmed: fatal
        ("/tmp/r,true,1024,yes", "accepts 1, true, 0 or false"),
        ("/tmp/r,true,010", "decimal digits without a leading zero"),  # strtoul base 0: octal 8
        ("/tmp/r,true,1e3", "decimal digits without a leading zero"),  # hex-ified: 483
        ("/tmp/r,true,-5", "decimal digits without a leading zero"),  # strtoul wraps: 4294967291
        ("/tmp/r,true,4294967296", "at most 4294967295"),  # cast to unsigned: 0, no limit
        ("/tmp/r,true,1024 ", "decimal digits without a leading zero"),  # trailing character: fatal
        (" /tmp/r,true", "without commas or surrounding spaces"),  # the path is taken as written
    ],
)
def test_recipe_cache_values_the_bridge_refuses_or_misreads(env: pytest.MonkeyPatch, value: str, accepts: str) -> None:
    env.setenv(RECIPE_CACHE_ENV, value)
    with pytest.raises(ValueError, match=accepts) as info:
        Runtime.from_env()
    assert f"{RECIPE_CACHE_ENV}={value!r}" in str(info.value)
    before = dict(os.environ)
    with pytest.raises(ValueError, match=accepts):
        configure(recipe_cache=value)
    assert dict(os.environ) == before


def test_configure_writes_every_documented_field(env: pytest.MonkeyPatch) -> None:
    settings = configure(recipe_cache=RecipeCache("/tmp/recipes", delete_on_start=True, max_size_mb=2048, on_nfs=True))
    assert os.environ[RECIPE_CACHE_ENV] == "/tmp/recipes,true,2048,true"
    assert settings.recipe_cache == RecipeCache("/tmp/recipes", True, 2048, True)
    # on_nfs false is the documented default: left out, so bridge 1.19 (which stops on a 4th field) reads it too
    configure(recipe_cache={"path": "/tmp/recipes", "on_nfs": False, "max_size_mb": 0})
    assert os.environ[RECIPE_CACHE_ENV] == "/tmp/recipes,false,0"
    configure(recipe_cache="/tmp/recipes")
    assert os.environ[RECIPE_CACHE_ENV] == "/tmp/recipes,false,1024"


def test_a_fourth_field_is_refused_where_the_installed_bridge_stops_on_it(env: pytest.MonkeyPatch) -> None:
    env.setenv(RECIPE_CACHE_ENV, FOUR_FIELDS)
    env.setattr(runtime, "bridge_release", lambda: (1, 19))  # recipe_cache_config.cpp:60-62: 1 to 3 fields
    with pytest.raises(ValueError, match=r"4th field .*habana-torch-plugin 1\.19.*Drop the 4th field"):
        Runtime.from_env()
    env.setenv(RECIPE_CACHE_ENV, "/tmp/recipes,false,1024")
    assert Runtime.from_env().recipe_cache == RecipeCache("/tmp/recipes")
    env.setenv(RECIPE_CACHE_ENV, FOUR_FIELDS)
    env.setenv(hpu.EMULATE_ENV, "eager")  # the emulator reads no recipe cache
    assert Runtime.from_env().recipe_cache == RecipeCache("/tmp/recipes", on_nfs=True)
    env.delenv(hpu.EMULATE_ENV)
    env.setattr(runtime, "bridge_release", lambda: (1, 23))
    assert Runtime.from_env().recipe_cache == RecipeCache("/tmp/recipes", on_nfs=True)


def test_missing_fields_keep_the_deprecated_variables(env: pytest.MonkeyPatch) -> None:
    # recipe_cache_config.cpp:74-101: a field left out leaves PT_CACHE_FOLDER_DELETE / _SIZE_MB as they are
    env.setenv(RECIPE_CACHE_DELETE_ENV, "TRUE")
    env.setenv(RECIPE_CACHE_SIZE_ENV, "64")
    env.setenv(RECIPE_CACHE_ENV, "/tmp/recipes")
    assert Runtime.from_env().recipe_cache == RecipeCache("/tmp/recipes", True, 64)
    env.setenv(RECIPE_CACHE_ENV, "/tmp/recipes,false,128")
    assert Runtime.from_env().recipe_cache == RecipeCache("/tmp/recipes", False, 128)


def test_inference_mode_appends_the_rank_to_the_directory() -> None:
    # recipe_cache_config.cpp:65-72: path + atoi(RANK or "0"), no separator, in inference mode only
    cache = RecipeCache("/tmp/recipes")
    assert cache.directory() == "/tmp/recipes"
    assert cache.directory(inference=True, environ={"RANK": "3"}) == "/tmp/recipes3"
    assert cache.directory(inference=True, environ={}) == "/tmp/recipes0"
    assert cache.directory(inference=True, environ={"RANK": "12abc"}) == "/tmp/recipes12"


def test_an_eager_fit_runs_with_the_documented_four_field_value(env: pytest.MonkeyPatch) -> None:
    env.setenv(hpu.EMULATE_ENV, "eager")
    env.setenv(RECIPE_CACHE_ENV, FOUR_FIELDS)
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(Workload(), loader(2))
    assert trainer.global_step == 1


# --- PT_HPU_LAZY_MODE -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "lazy"), [("0", False), ("1", True)])
def test_lazy_mode_zero_or_one(env: pytest.MonkeyPatch, value: str, lazy: bool) -> None:
    env.setenv(LAZY_MODE_ENV, value)
    assert runtime.lazy_mode() is lazy
    assert Runtime.from_env().execution_mode == ("lazy" if lazy else "eager")


# "false": lazy to is_lazy() (internal.py:27), ValueError from int() at hccl/__init__.py:11 during the bridge's import;
# "00", " 0": lazy to is_lazy(), eager to int() and strtoul; "2": lazy to is_lazy(), not to graphs.py:960 (== "1")
# and a debug flush mode to lazy_kernels.cpp:212; "": int("") raises.
@pytest.mark.parametrize("value", ["false", "true", "False", "", "00", " 0", "1 ", "2", "yes"])
def test_lazy_mode_values_the_bridge_breaks_on_or_misreads(env: pytest.MonkeyPatch, value: str) -> None:
    env.setenv(LAZY_MODE_ENV, value)
    for emulation in (None, "eager"):
        if emulation:
            env.setenv(hpu.EMULATE_ENV, emulation)
        with pytest.raises(ValueError, match=f"accepts {LAZY_MODE_ENV}=0 .* or {LAZY_MODE_ENV}=1") as info:
            Runtime.from_env()
        assert f"{LAZY_MODE_ENV}={value!r}" in str(info.value)
        with pytest.raises(ValueError, match=LAZY_MODE_ENV):
            hpu.get_backend()


@pytest.mark.double_only("needs a bridge not loaded yet (Intel's loads once per process; the double, per test)")
def test_lazy_mode_false_is_refused_before_the_bridge_loads(bridge_double: ModuleType, env: pytest.MonkeyPatch) -> None:
    env.setenv(LAZY_MODE_ENV, "false")
    with pytest.raises(ValueError, match=r"PT_HPU_LAZY_MODE='false'.*accepts PT_HPU_LAZY_MODE=0"):
        hpu.get_backend()
    with pytest.raises(ValueError, match=r"PT_HPU_LAZY_MODE='false'"):
        quiet_trainer(max_steps=1)
    assert "habana_frameworks.torch" not in sys.modules


def test_lazy_mode_false_is_refused_before_ranks_start(env: pytest.MonkeyPatch) -> None:
    env.setenv(hpu.EMULATE_ENV, "eager")
    env.setenv(LAZY_MODE_ENV, "false")
    with pytest.raises(ValueError, match=r"PT_HPU_LAZY_MODE='false'"):
        quiet_trainer(max_steps=1, devices=2, strategy="ddp")  # Trainer(...) reads it: no process started yet


# --- PT_ENABLE_INT64_SUPPORT (bool flag, scripts/env_flags.yaml:624-627) -----------------------------------------


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("TRUE", True), ("false", False), ("", None)])
def test_int64_support_as_the_bridge_reads_it(env: pytest.MonkeyPatch, value: str, expected: bool | None) -> None:
    env.setenv(INT64_ENV, value)  # empty: unset to the bridge (env_flags.cpp:294-300)
    assert Runtime.from_env().int64_support is expected


@pytest.mark.parametrize("value", ["2", " true", "yes"])
def test_int64_support_the_bridge_stops_on(env: pytest.MonkeyPatch, value: str) -> None:
    env.setenv(INT64_ENV, value)
    with pytest.raises(ValueError, match=r"accepts 1, true, 0 or false") as info:
        Runtime.from_env()
    assert f"{INT64_ENV}={value!r}" in str(info.value)
