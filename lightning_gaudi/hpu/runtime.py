"""The HPU runtime settings as one typed value, :class:`Runtime`, applied by :func:`configure` to the environment
variables (which later processes inherit); :meth:`Runtime.from_env` is their only parser."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
import tempfile
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

from lightning_gaudi.hpu.autocast_lists import BF16_LIST_ENV, FP32_LIST_ENV, LEGACY_ENV, check_op_names, read_list
from lightning_gaudi.hpu.autocast_lists import write_list as _write_list
from lightning_gaudi.hpu.backend import GAUDI_NAMES

EMULATE_ENV = "LIGHTNING_GAUDI_EMULATE"
DEVICES_ENV = "LIGHTNING_GAUDI_DEVICES"
DEVICE_NAME_ENV = "LIGHTNING_GAUDI_DEVICE_NAME"
#: Intel's list of the cards (module ids) a process may use; Ray Train sets it per worker from its ``HPU`` resource.
VISIBLE_MODULES_ENV = "HABANA_VISIBLE_MODULES"
LAZY_MODE_ENV = "PT_HPU_LAZY_MODE"
INT64_ENV = "PT_ENABLE_INT64_SUPPORT"
RECIPE_CACHE_ENV = "PT_HPU_RECIPE_CACHE_CONFIG"
#: ``1`` in compile mode (eager + ``torch.compile``).
COMPILE_ENV = "LIGHTNING_GAUDI_COMPILE"
#: The ``torch.compile`` backend of eager emulation (a Gaudi always uses ``hpu_backend``).
COMPILE_BACKEND_ENV = "LIGHTNING_GAUDI_COMPILE_BACKEND"
DEFAULT_EMULATED_COMPILE_BACKEND = "inductor"
#: The compile cache policy's folder (``lightning_gaudi.compile_cache``), or ``off``.
COMPILE_CACHE_ENV = "LIGHTNING_GAUDI_COMPILE_CACHE"
_OFF = ("0", "off", "false", "none")
#: Variables the bridge reads once, when it loads.
BRIDGE_ENV = (LAZY_MODE_ENV, INT64_ENV, RECIPE_CACHE_ENV, BF16_LIST_ENV, FP32_LIST_ENV)

EMULATION_MODES = ("eager", "lazy")
EXECUTION_MODES = ("lazy", "eager", "compile")
#: The most emulated cards a node gets by default: one Gaudi server.
DEFAULT_EMULATED_DEVICES = 8
DEFAULT_DEVICE_NAME = "GAUDI2"
#: The bridge's booleans, in any case (v1.19.0 ``backend/synapse_helpers/env_flags.cpp:261-281``).
_BRIDGE_BOOLS = {"1": True, "true": True, "0": False, "false": False}
#: The bridge's ``unsigned`` flags hold at most this (v1.19.0 ``env_flags.cpp:476-481``).
_UNSIGNED_MAX = 2**32 - 1
#: Recipe-cache default size (v1.19.0 ``scripts/env_flags.yaml:715-723``).
DEFAULT_RECIPE_CACHE_MB = 1024
#: What a missing field of ``PT_HPU_RECIPE_CACHE_CONFIG`` leaves in force (v1.19.0
#: ``pytorch_helpers/habana_helpers/habana_serialization/recipe_cache_config.cpp:74-101``).
RECIPE_CACHE_DELETE_ENV = "PT_CACHE_FOLDER_DELETE"
RECIPE_CACHE_SIZE_ENV = "PT_CACHE_FOLDER_SIZE_MB"
BRIDGE_DISTRIBUTION = "habana-torch-plugin"
#: The last bridge release that stops on a 4th recipe-cache field (v1.19.0 ``recipe_cache_config.cpp:60-62``).
LAST_THREE_FIELD_BRIDGE = (1, 19)


ExecutionMode = Literal["lazy", "eager", "compile"]
GaudiName = Literal["GAUDI", "GAUDI2", "GAUDI3"]


def bridge_installed() -> bool:
    """Whether Intel's ``habana_frameworks`` package can be imported (without importing it)."""
    return importlib.util.find_spec("habana_frameworks") is not None


#: The bridge's lazy-mode plug-in library (bridge 1.19: ``libhabana_pytorch_plugin.so``; eager mode loads
#: ``libhabana_pytorch2_plugin.so``, and either gets a ``.upstream`` suffix on stock PyTorch).
LAZY_PLUGIN = "libhabana_pytorch_plugin.so"
#: How a build without lazy mode is run instead.
NO_LAZY_FIX = (
    f"Use eager mode ({LAZY_MODE_ENV}=0) or compile mode (lightning_gaudi.configure(execution_mode='compile')),"
    " or, for lazy mode, Intel's Gaudi PyTorch container built on Intel's PyTorch fork"
)


def lazy_mode_unavailable(torch_version: str | None = None) -> str | None:
    """Why the installed Gaudi software has no lazy mode (Intel's PyTorch fork and the lazy plug-in), or ``None``."""
    try:
        spec = importlib.util.find_spec("habana_frameworks.torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    if not lib.is_dir():
        return None
    if torch_version is None:
        try:
            torch_version = version("torch")
        except PackageNotFoundError:
            return None
    local = torch_version.partition("+")[2]
    if not local.startswith("git"):
        return (
            f"this Gaudi software runs on stock PyTorch (torch {torch_version}), where Intel's bridge has no lazy mode"
        )
    if not (lib / LAZY_PLUGIN).is_file():
        return f"this Gaudi software ships no lazy-mode plug-in ({LAZY_PLUGIN} is not in {lib})"
    return None


def bridge_loaded() -> bool:
    """Whether Intel's bridge has already been imported in this process."""
    return "habana_frameworks.torch" in sys.modules


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def emulation_mode(environ: Mapping[str, str] | None = None) -> str | None:
    """The emulation mode ``LIGHTNING_GAUDI_EMULATE`` asks for (``eager``, ``lazy``), or ``None`` for the bridge."""
    env = _environ(environ)
    value = env.get(EMULATE_ENV, "").strip().lower()
    if value in ("", "0", "off", "none"):
        return None
    if value not in EMULATION_MODES:
        raise ValueError(
            f"{EMULATE_ENV}={env[EMULATE_ENV]!r} is not an emulation mode. Set it to 'eager' (HPU code paths"
            " on CPU tensors) or 'lazy' (torch's Lazy Tensor Core), or unset it to use a real Gaudi."
        )
    return value


def default_emulated_devices() -> int:
    """The emulated cards per node when unset: the usable cores, at most 8 (one server)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(usable, DEFAULT_EMULATED_DEVICES))


def emulated_devices(environ: Mapping[str, str] | None = None) -> int:
    """Emulated cards per node: ``LIGHTNING_GAUDI_DEVICES``, else :func:`default_emulated_devices`."""
    raw = _environ(environ).get(DEVICES_ENV, str(default_emulated_devices()))
    try:
        devices = int(raw)
    except ValueError:
        devices = -1
    if devices < 1:
        raise ValueError(f"{DEVICES_ENV}={raw!r} must be a positive integer: the number of emulated HPUs per node.")
    return devices


def visible_emulated_devices(environ: Mapping[str, str] | None = None) -> int:
    """The emulated cards this process sees: those ``HABANA_VISIBLE_MODULES`` lists where set, else every one."""
    env = _environ(environ)
    cards = emulated_devices(env)
    raw = env.get(VISIBLE_MODULES_ENV)
    if raw is None:
        return cards
    ids = [part.strip() for part in raw.split(",") if part.strip()]
    if not all(i.isdigit() and int(i) < cards for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(
            f"{VISIBLE_MODULES_ENV}={raw!r} must list distinct card ids from 0 to {cards - 1}, like '0' or '2,3': the"
            f" emulated node has {cards} cards ({DEVICES_ENV}). Fix it, or unset it to see every card."
        )
    return len(ids)


def emulated_device_name(environ: Mapping[str, str] | None = None) -> str:
    """The emulated Gaudi generation (``LIGHTNING_GAUDI_DEVICE_NAME``, default ``GAUDI2``)."""
    name = _environ(environ).get(DEVICE_NAME_ENV, DEFAULT_DEVICE_NAME).strip().upper()
    if name not in GAUDI_NAMES:
        raise ValueError(
            f"{DEVICE_NAME_ENV}={name!r} is not a Gaudi generation; choose one of {', '.join(GAUDI_NAMES)}."
        )
    return name


def emulated_compile_backend(environ: Mapping[str, str] | None = None) -> str:
    """The ``torch.compile`` backend of eager emulation: ``LIGHTNING_GAUDI_COMPILE_BACKEND``, else ``inductor``."""
    return _environ(environ).get(COMPILE_BACKEND_ENV, "").strip() or DEFAULT_EMULATED_COMPILE_BACKEND


def _flag(name: str, value: Any) -> bool | None:
    """A bool, or a string the bridge reads as one (:func:`bridge_bool`)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return bridge_bool(name, value)
    raise ValueError(f"`{name}={value!r}` must be true or false.")


def bridge_bool(name: str, raw: str) -> bool:
    """``raw`` read as the bridge reads a boolean (``env_flags.cpp:261-281``), or ``ValueError`` naming ``name``."""
    parsed = _BRIDGE_BOOLS.get(raw.lower()) if raw.isascii() else None
    if parsed is None:
        raise ValueError(
            f"{name}={raw!r} is not a boolean Intel's bridge reads: it accepts 1, true, 0 or false (any case, no"
            " spaces) and stops on anything else."
        )
    return parsed


def bridge_unsigned(name: str, raw: str) -> int:
    """``raw`` as an ``unsigned`` the bridge reads as written, or ``ValueError`` naming ``name``: the bridge reads
    other forms its own way (v1.19.0 ``env_flags.cpp:307-396``: hex without ``0x``, octal, wrapped, truncated)."""
    value = int(raw, 0) if re.fullmatch(r"0|[1-9][0-9]*|0[xX][0-9a-fA-F]+", raw) else None
    if value is None or value > _UNSIGNED_MAX:
        raise ValueError(
            f"{name}={raw!r} is not a whole number Intel's bridge reads as written (it reads 010 as 8, 1e3 as 483,"
            f" -5 as 4294967291): use decimal digits without a leading zero, sign or space (or 0x and hex digits),"
            f" at most {_UNSIGNED_MAX}."
        )
    return value


def lazy_mode(environ: Mapping[str, str] | None = None) -> bool | None:
    """Whether ``PT_HPU_LAZY_MODE`` asks for lazy mode (``None`` when unset); ``ValueError`` for any value but
    ``0`` and ``1``, the only ones bridge 1.19's four readers agree on (v1.19.0 ``torch/utils/internal.py:27``:
    ``!= "0"``; ``distributed/hccl/__init__.py:11``: ``int()``; ``env_flags.yaml:83-85``: unsigned;
    ``hpu/graphs.py:960``: ``== "1"``)."""
    raw = _environ(environ).get(LAZY_MODE_ENV)
    if raw is None:
        return None
    if raw not in ("0", "1"):
        raise ValueError(
            f"{LAZY_MODE_ENV}={raw!r} is not a value Intel's bridge reads one way; it accepts {LAZY_MODE_ENV}=0 (eager"
            f" and compile mode) or {LAZY_MODE_ENV}=1 (lazy mode), or the variable unset."
        )
    return raw == "1"


def split_recipe_cache(value: str) -> list[str]:
    """``PT_HPU_RECIPE_CACHE_CONFIG``'s fields as ``std::getline`` cuts them: a trailing comma adds no field (v1.19.0
    ``recipe_cache_config.cpp:104-113``)."""
    return value.removesuffix(",").split(",")


@dataclass(frozen=True)
class RecipeCache:
    """The bridge's on-disk cache of compiled graphs (``PT_HPU_RECIPE_CACHE_CONFIG``): a directory (``""``: none),
    whether to empty it at start, its size limit in MB (``0``: none) and whether it is on NFS (written only when true:
    bridge 1.19 stops on a 4th field)."""

    path: str
    delete_on_start: bool = False
    max_size_mb: int = DEFAULT_RECIPE_CACHE_MB
    on_nfs: bool = False

    def __post_init__(self) -> None:
        path = self.path
        if not isinstance(path, str) or "," in path or path != path.strip():
            raise ValueError(
                f"recipe cache path {path!r} must be a directory path without commas or surrounding spaces (the"
                " bridge cuts the variable at commas and takes the path as written), or '' for no disk cache."
            )
        for name in ("delete_on_start", "on_nfs"):
            if getattr(self, name) is None:
                raise ValueError(f"recipe cache {name}=None must be true or false.")
            object.__setattr__(self, name, _flag(f"recipe cache {name}", getattr(self, name)))
        size = self.max_size_mb
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= _UNSIGNED_MAX:
            raise ValueError(
                f"recipe cache max_size_mb={size!r} must be a whole number of megabytes from 0 (no limit) to"
                f" {_UNSIGNED_MAX}."
            )

    @classmethod
    def parse(
        cls,
        value: RecipeCache | str | Mapping[str, Any],
        environ: Mapping[str, str] | None = None,
    ) -> RecipeCache:
        """Reads ``"<dir>[,<delete_on_start>[,<max_MB>[,<on_nfs>]]]"`` as the bridge does, a mapping of the fields, or
        an instance; a missing or empty field keeps ``PT_CACHE_FOLDER_DELETE`` / ``PT_CACHE_FOLDER_SIZE_MB`` of
        ``environ``, else false / 1024 (v1.19.0 ``recipe_cache_config.cpp:74-101``)."""
        if isinstance(value, RecipeCache):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {"path", "delete_on_start", "max_size_mb", "on_nfs"}
            if unknown or "path" not in value:
                raise ValueError(
                    f"recipe cache {dict(value)!r} needs `path` and may have `delete_on_start`, `max_size_mb`,"
                    f" `on_nfs` (unknown: {sorted(unknown) or 'none'})."
                )
            return cls(**value)
        form = "'<dir>[,<delete_on_start true|false>[,<max_MB>[,<on_nfs true|false>]]]', e.g. '/tmp/recipes,false,1024'"
        if not isinstance(value, str) or not value:
            raise ValueError(f"recipe cache {value!r} must be a string like {form}, or a mapping.")
        name = f"{RECIPE_CACHE_ENV}={value!r}"
        parts = split_recipe_cache(value)
        if len(parts) > 4:
            raise ValueError(f"{name} has {len(parts)} comma-separated fields; it takes 1 to 4: {form}.")
        env = environ or {}
        fields = parts + [""] * (4 - len(parts))
        delete, size = env.get(RECIPE_CACHE_DELETE_ENV), env.get(RECIPE_CACHE_SIZE_ENV)
        delete_on_start = bridge_bool(RECIPE_CACHE_DELETE_ENV, delete) if delete else False
        max_size_mb = bridge_unsigned(RECIPE_CACHE_SIZE_ENV, size) if size else DEFAULT_RECIPE_CACHE_MB
        if fields[1]:
            delete_on_start = bridge_bool(f"{name}: delete_on_start (field 2)", fields[1])
        if fields[2]:
            max_size_mb = bridge_unsigned(f"{name}: max_MB (field 3)", fields[2])
        on_nfs = bridge_bool(f"{name}: on_nfs (field 4)", fields[3]) if fields[3] else False
        try:
            return cls(fields[0], delete_on_start, max_size_mb, on_nfs)
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None

    def env_value(self) -> str:
        """The value of ``PT_HPU_RECIPE_CACHE_CONFIG`` (the 4th field only when ``on_nfs``)."""
        value = f"{self.path},{str(self.delete_on_start).lower()},{self.max_size_mb}"
        return f"{value},true" if self.on_nfs else value

    def directory(self, inference: bool = False, environ: Mapping[str, str] | None = None) -> str:
        """Where the bridge keeps the recipes: :attr:`path`, with ``RANK`` read by C's ``atoi`` appended in inference
        mode (v1.19.0 ``recipe_cache_config.cpp:65-72``)."""
        if not inference or not self.path:
            return self.path
        atoi = re.match(r"[ \t\n\v\f\r]*([+-]?[0-9]+)", _environ(environ).get("RANK", "0"))
        return f"{self.path}{int(atoi[1]) if atoi else 0}"


def compile_cache_root(environ: Mapping[str, str] | None = None) -> Path | None:
    """Where the compile cache policy keeps its folders: ``LIGHTNING_GAUDI_COMPILE_CACHE``, by default a node-local
    ``<temp dir>/lightning_gaudi_compile_cache_<uid>``; ``None`` when it is ``off``."""
    raw = _environ(environ).get(COMPILE_CACHE_ENV, "").strip()
    if raw.lower() in _OFF:
        return None
    default = Path(tempfile.gettempdir()) / f"lightning_gaudi_compile_cache_{getattr(os, 'getuid', lambda: 0)()}"
    return Path(raw or default).absolute()


def default_recipe_cache(environ: Mapping[str, str] | None = None) -> RecipeCache | None:
    """The recipe cache the policy gives a Gaudi where ``PT_HPU_RECIPE_CACHE_CONFIG`` is unset: a folder per torch and
    Gaudi software release under :func:`compile_cache_root`."""
    env = _environ(environ)
    root = compile_cache_root(env)
    if root is None or env.get(RECIPE_CACHE_ENV):
        return None
    release = ".".join(map(str, bridge_release() or ("unknown",)))
    return RecipeCache(str(root / f"recipes-torch{version('torch')}-gaudi{release}"))


def bridge_release() -> tuple[int, int] | None:
    """The installed bridge's (major, minor) release from its distribution's metadata, or ``None``."""
    try:
        parts = version(BRIDGE_DISTRIBUTION).split(".")
        return int(parts[0]), int(parts[1])
    except (PackageNotFoundError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Runtime:
    """The HPU runtime settings, validated at construction; ``None`` leaves a setting as it is (``docs/runtime.md``).

    Args:
        emulate: ``True``: the CPU emulator, ``False``: a Gaudi, ``None``: emulate when asked or without the bridge.
        execution_mode: ``"compile"`` (eager + ``torch.compile``), ``"eager"`` or ``"lazy"``.
        emulated_devices, emulated_device_name: the emulated node's cards and generation (``"GAUDI2"`` when unset).
        int64_support: keep int64 tensors instead of casting them to int32.
        recipe_cache: a :class:`RecipeCache`, a mapping of its fields, or its string.
        compile_cache: the compile cache policy's folder (``lightning_gaudi.compile_cache``); ``True``: the default
            folder, ``False``: no policy (torch's and Intel's defaults apply).
        autocast_bf16_ops, autocast_fp32_ops: op names autocast runs in bfloat16 / keeps in float32.
        autocast_list_dir: where the list files are written (a new temporary directory when ``None``).
    """

    emulate: bool | None = None
    execution_mode: ExecutionMode | None = None
    emulated_devices: int | None = None
    emulated_device_name: GaudiName | None = None
    int64_support: bool | None = None
    recipe_cache: RecipeCache | str | Mapping[str, Any] | None = None
    compile_cache: bool | str | None = None
    autocast_bf16_ops: Sequence[str] | None = None
    autocast_fp32_ops: Sequence[str] | None = None
    autocast_list_dir: str | None = None

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        put("emulate", _flag("emulate", self.emulate))
        put("int64_support", _flag("int64_support", self.int64_support))
        if self.execution_mode is not None and self.execution_mode not in EXECUTION_MODES:
            raise ValueError(
                f"`execution_mode={self.execution_mode!r}` is not an execution mode; use 'compile' (eager +"
                " torch.compile), 'eager' or 'lazy' (or leave it unset for the default)."
            )
        devices = self.emulated_devices
        if devices is not None and (isinstance(devices, bool) or not isinstance(devices, int) or devices < 1):
            raise ValueError(f"`emulated_devices={devices!r}` must be a positive number of emulated cards.")
        name = self.emulated_device_name
        if name is not None:
            if not isinstance(name, str) or name.upper() not in GAUDI_NAMES:
                choices = ", ".join(GAUDI_NAMES)
                raise ValueError(f"`emulated_device_name={name!r}` is not a Gaudi generation; choose one of {choices}.")
            put("emulated_device_name", name.upper())
        if self.recipe_cache is not None:
            put("recipe_cache", RecipeCache.parse(self.recipe_cache))
        cache = self.compile_cache
        if not isinstance(cache, (bool, str, type(None))) or (
            isinstance(cache, str) and cache.strip().lower() in (*_OFF, "")
        ):
            raise ValueError(
                f"`compile_cache={cache!r}` is not a folder; pass a folder path, True for the default folder, or"
                " compile_cache=False to turn the compile cache policy off."
            )
        put("autocast_bf16_ops", check_op_names("autocast_bf16_ops", self.autocast_bf16_ops))
        put("autocast_fp32_ops", check_op_names("autocast_fp32_ops", self.autocast_fp32_ops))
        both = sorted(set(self.autocast_bf16_ops or ()) & set(self.autocast_fp32_ops or ()))
        if both:
            raise ValueError(
                f"{both} are in both `autocast_bf16_ops` and `autocast_fp32_ops`; name each op in one list only."
            )
        if self.autocast_list_dir is not None:
            put("autocast_list_dir", str(self.autocast_list_dir))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Runtime:
        """The settings in force, read from ``environ`` (``os.environ`` by default); a malformed value raises."""
        env = _environ(environ)
        mode = emulation_mode(env)
        lazy = env.get(LAZY_MODE_ENV)
        parsed = lazy_mode(env)  # refused in emulation too: the same job would stop on a Gaudi
        execution_mode: str | None = mode
        if mode is None and parsed is not None:
            execution_mode = "lazy" if parsed else "eager"
        if _compile_flag(env):
            if execution_mode == "lazy":
                source = f"{EMULATE_ENV}=lazy" if mode else f"{LAZY_MODE_ENV}={lazy}"
                raise ValueError(
                    f"{COMPILE_ENV}=1 asks for compile mode (eager + torch.compile), but {source} asks for lazy mode."
                    f" Unset {COMPILE_ENV} for lazy mode, or use eager mode ({EMULATE_ENV}=eager in emulation,"
                    f" {LAZY_MODE_ENV}=0 on a Gaudi); lightning_gaudi.configure(execution_mode=...) sets both."
                )
            execution_mode = "compile"
        recipe_cache = _recipe_cache_from_env(env, emulated=mode is not None)
        lists = {key: read_list(env.get(key)) for key in (BF16_LIST_ENV, FP32_LIST_ENV)}
        list_file = env.get(BF16_LIST_ENV) or env.get(FP32_LIST_ENV)
        return cls(
            emulate=mode is not None,
            execution_mode=execution_mode,  # type: ignore[arg-type]
            emulated_devices=emulated_devices(env) if DEVICES_ENV in env else None,
            emulated_device_name=emulated_device_name(env) if DEVICE_NAME_ENV in env else None,  # type: ignore[arg-type]
            int64_support=_flag(INT64_ENV, env.get(INT64_ENV) or None),  # empty is unset (env_flags.cpp:294-300)
            recipe_cache=recipe_cache,
            compile_cache=_compile_cache_from_env(env),
            autocast_bf16_ops=lists[BF16_LIST_ENV],
            autocast_fp32_ops=lists[FP32_LIST_ENV],
            autocast_list_dir=str(Path(list_file).parent) if list_file and any(lists.values()) else None,
        )

    def replace(self, **changes: Any) -> Runtime:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)


def _recipe_cache_from_env(env: Mapping[str, str], emulated: bool) -> RecipeCache | None:
    """``PT_HPU_RECIPE_CACHE_CONFIG`` (empty is unset, as for the bridge: ``env_flags.cpp:248-258``); a 4th field is
    refused where the installed bridge is known to stop on it (bridge 1.19, ``recipe_cache_config.cpp:60-62``)."""
    value = env.get(RECIPE_CACHE_ENV)
    if not value:
        return None
    cache = RecipeCache.parse(value, env)
    release = None if emulated or len(split_recipe_cache(value)) < 4 else bridge_release()
    if release is not None and release <= LAST_THREE_FIELD_BRIDGE:
        raise ValueError(
            f"{RECIPE_CACHE_ENV}={value!r} has a 4th field (on_nfs), but the installed bridge"
            f" ({BRIDGE_DISTRIBUTION} {release[0]}.{release[1]}) reads 1 to 3 fields and stops on a 4th. Drop the"
            " 4th field (its default is false: a local disk), or use Gaudi software that documents it."
        )
    return cache


def _compile_cache_from_env(env: Mapping[str, str]) -> str | bool | None:
    raw = env.get(COMPILE_CACHE_ENV, "").strip()
    return False if raw.lower() in _OFF else raw or None


def _compile_flag(env: Mapping[str, str]) -> bool:
    value = env.get(COMPILE_ENV, "")
    parsed = _BRIDGE_BOOLS.get(value.strip().lower()) if value.strip() else False
    if parsed is None:
        raise ValueError(f"{COMPILE_ENV}={value!r} must be 1 (compile mode: eager + torch.compile) or 0.")
    return parsed


def _autocast_changes(settings: Runtime, env: Mapping[str, str]) -> dict[str, str]:
    """The list-file variables to set (lists whose files already hold the same names are left alone)."""
    wanted = {BF16_LIST_ENV: settings.autocast_bf16_ops, FP32_LIST_ENV: settings.autocast_fp32_ops}
    stale = {key: ops for key, ops in wanted.items() if ops is not None and read_list(env.get(key)) != ops}
    if not stale:
        return {}
    if bridge_loaded():
        return {key: "<a new list file>" for key in stale}  # reported as an error by configure
    directory = Path(settings.autocast_list_dir or tempfile.mkdtemp(prefix="lightning_gaudi_autocast_"))
    changes = {}
    for key, ops in stale.items():
        assert ops is not None
        changes[key] = changes[LEGACY_ENV[key]] = str(_write_list(directory, key, tuple(ops)))
    return changes


def configure(runtime: Runtime | None = None, /, **settings: Any) -> Runtime:
    """Applies a :class:`Runtime` (or its fields as keyword arguments) before the bridge loads; returns the settings
    in force. Raises ``RuntimeError`` when the loaded bridge would ignore a change (nothing changes when it raises)."""
    if runtime is not None and settings:
        raise TypeError("configure() takes a Runtime or keyword arguments, not both.")
    wanted = runtime if runtime is not None else Runtime(**settings)
    env: MutableMapping[str, str] = os.environ
    current_mode = emulation_mode(env)
    emulate = wanted.emulate
    if emulate is None:  # the Trainer's "HPU available" line says when this chose emulation, and why
        emulate = current_mode is not None or not bridge_installed()
    changes: dict[str, str | None] = {}
    if emulate:  # compile mode runs on eager emulation
        changes[EMULATE_ENV] = (
            "eager" if wanted.execution_mode == "compile" else wanted.execution_mode or current_mode or "eager"
        )
    else:
        changes[EMULATE_ENV] = None
        if wanted.execution_mode == "lazy" and (why := lazy_mode_unavailable()) is not None:
            raise ValueError(f"`execution_mode='lazy'` cannot run: {why}. {NO_LAZY_FIX}.")
        if wanted.execution_mode is not None:
            changes[LAZY_MODE_ENV] = "1" if wanted.execution_mode == "lazy" else "0"
    if wanted.execution_mode is not None:
        changes[COMPILE_ENV] = "1" if wanted.execution_mode == "compile" else None
    if wanted.emulated_devices is not None:
        changes[DEVICES_ENV] = str(wanted.emulated_devices)
    if wanted.emulated_device_name is not None:
        changes[DEVICE_NAME_ENV] = wanted.emulated_device_name
    if wanted.int64_support is not None:
        changes[INT64_ENV] = "1" if wanted.int64_support else "0"
    if isinstance(wanted.recipe_cache, RecipeCache):
        changes[RECIPE_CACHE_ENV] = wanted.recipe_cache.env_value()
    if wanted.compile_cache is not None:
        cache = wanted.compile_cache
        changes[COMPILE_CACHE_ENV] = None if cache is True else "off" if cache is False else str(cache)
    changes.update(_autocast_changes(wanted, env))

    changed = {key: value for key, value in changes.items() if env.get(key) != value}
    late = [key for key in changed if key in BRIDGE_ENV]
    if late and bridge_loaded():
        raise RuntimeError(
            f"Intel's bridge is already loaded, so {', '.join(late)} can no longer take effect. Call"
            " lightning_gaudi.configure(...) before building the Trainer and before anything imports"
            " habana_frameworks, or export the variables before starting Python."
        )
    after = {key: value for key, value in {**env, **changed}.items() if value is not None}
    Runtime.from_env(after)  # a contradiction with a variable already set (compile flag + lazy) changes nothing
    for key, value in changed.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return Runtime.from_env(env)
