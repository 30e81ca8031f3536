"""What a profile may hold: its sections and keys, the environment variables it may set (an
allowlist), and the types and legal values of what autotune computes with.

A profile is untrusted input (a file from elsewhere, or a study in a shared database that
``autotune export`` reads). ``check_mapping`` is the whole check of a profile file's mapping,
``check_values`` the part that also holds for a profile built from a stored trial
configuration (``Profile.from_config``), ``shell_exports`` the only way autotune writes an
environment for a shell.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from typing import Any

from autotune.core import bounds, validate
from autotune.core import safe_yaml as _yaml
from autotune.core.errors import ConfigError
from autotune.core.validate import ALLOWED_ENV, HOOK_KEYS, check_env
from autotune.core.values import boolean, int_range

__all__ = [
    "ALLOWED_ENV",
    "FILE_FIX",
    "HOOK_KEYS",
    "PROFILE_VERSION",
    "REQUIRED",
    "SECTIONS",
    "TOP",
    "check_env",
    "check_mapping",
    "check_values",
    "shell_exports",
]

PROFILE_VERSION = 1

SECTIONS = {
    "study": ("name", "best_trial", "baseline_trial"),
    "workload": ("trainer", "options", "world_size", "backend", "global_batch", "free_batch"),
    "hardware": (
        "device",
        "device_name",
        "device_count",
        "node_count",
        "torch",
        "cuda",
        "driver",
        "nccl",
        "nvlink",
        "bf16_native",
    ),
    "measured": (
        "baseline_samples_per_s",
        "best_samples_per_s",
        "speedup",
        "speedup_interval",
        "interval",
        "validation",
        "trials",
        "budget",
        "tuning_s",
        "note",
        "numerics_drift",
        "numerics_unjudged",
        "baseline_peak_memory_mb",
        "pareto",
        "batch_changed",
        "baseline_runs",
        "screening",
        "ablation",
        "limit",
        "as_is",
    ),
    "ddp": ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "comm_hook", "compile"),
    "data": ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers"),
    "batch": ("micro_batch", "accumulation_steps", "global_batch"),
}
REQUIRED = {
    "study": ("name",),
    "workload": ("trainer", "world_size", "backend", "global_batch"),
    "hardware": ("device",),
    "measured": ("baseline_samples_per_s", "best_samples_per_s", "speedup"),
    "ddp": ("comm_hook",),
    "data": (),
    "batch": ("micro_batch", "accumulation_steps", "global_batch"),
}
TOP = (
    "version",
    "study",
    "workload",
    "hardware",
    "measured",
    "env",
    "ddp",
    "data",
    "precision",
    "batch",
)
#: How a file's problem is fixed (a study's: ``Profile.from_config``).
FILE_FIX = validate.FILE_FIX


#: The workload's values autotune computes with (the configuration's: ``core.validate``).
_WORKLOAD_RULES: dict[str, Callable[[Any], str | None]] = {
    "world_size": int_range(1, bounds.MAX_WORLD_SIZE),
    "global_batch": int_range(1, bounds.MAX_GLOBAL_BATCH),
    "free_batch": boolean,
}


def check_values(data: Mapping[str, Any], *, where: str, fix: str) -> None:
    """A profile's values by the one check of a configuration (``core.validate``: env,
    DDP kwargs, hook, DataLoader, batch, precision, each in its bounds) and the workload's."""
    validate.check_env(data.get("env", {}), where=where, fix=fix)
    ddp = data.get("ddp") if isinstance(data.get("ddp"), dict) else {}
    env = data.get("env", {})
    threads = {"threads": int(env["OMP_NUM_THREADS"])} if "OMP_NUM_THREADS" in env else {}
    validate.check_sections(
        {
            "ddp": {k: v for k, v in ddp.items() if k != "comm_hook"},
            "ddp.comm_hook": ddp.get("comm_hook"),
            "data": data.get("data"),
            "batch": data.get("batch") if isinstance(data.get("batch"), dict) else {},
            "threads": threads,
            "precision": {"precision": data["precision"]} if "precision" in data else {},
        },
        where=where,
        fix=fix,
    )
    workload = data.get("workload")
    for key, rule in _WORKLOAD_RULES.items():
        if isinstance(workload, dict) and key in workload and (reason := rule(workload[key])):
            raise ConfigError(f"{where}: workload.{key} {reason}, got {workload[key]!r}; {fix}")


def shell_exports(env: Mapping[str, str]) -> str:
    """``export NAME=value`` lines for a POSIX shell to ``eval``, names and values quoted, so
    that ``eval`` sets exactly these strings and runs nothing else."""
    return "".join(f"export {shlex.quote(k)}={shlex.quote(v)}\n" for k, v in env.items())


def check_mapping(data: dict[str, Any], *, where: str = "profile") -> None:
    """A profile file's mapping: every section and key known and present where required, the
    version this autotune reads, every value by ``check_values``, and the batch arithmetic."""
    try:
        _check_structure(data, where)
    except ConfigError as e:
        raise ConfigError(f"{e}; {FILE_FIX}") from None
    check_values(data, where=where, fix=FILE_FIX)
    b, w = data["batch"], data["workload"]
    if b["micro_batch"] * b["accumulation_steps"] * w["world_size"] != b["global_batch"]:
        raise ConfigError(
            f"{where}: batch.micro_batch x batch.accumulation_steps x workload.world_size "
            f"must equal batch.global_batch, got {b['micro_batch']} x "
            f"{b['accumulation_steps']} x {w['world_size']} != {b['global_batch']}"
        )


def _check_structure(data: dict[str, Any], where: str) -> None:
    """Every section and key known and present where required, the version this reads."""
    _yaml.check_keys(data, where=where, allowed=TOP, required=TOP)
    if type(data["version"]) is not int or data["version"] != PROFILE_VERSION:  # true == 1
        raise ConfigError(
            f"{where}: version {data['version']!r} is not supported; this autotune reads "
            f"version {PROFILE_VERSION}"
        )
    for section, keys in SECTIONS.items():
        value = data[section]
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {section} must be a mapping")
        _yaml.check_keys(
            value, where=f"{where}: {section}", allowed=keys, required=REQUIRED[section]
        )
    hook = data["ddp"]["comm_hook"]
    if not isinstance(hook, dict):
        raise ConfigError(f"{where}: ddp.comm_hook must be a mapping like {{name: fp16}}")
    powersgd = hook.get("name") == "powersgd"  # its rank has no default: it is the setting
    required = ("name", "matrix_approximation_rank") if powersgd else ("name",)
    _yaml.check_keys(hook, where=f"{where}: ddp.comm_hook", allowed=HOOK_KEYS, required=required)
    for section, depth in _DESCRIPTIVE.items():
        for key, value in data[section].items():
            _check_small(value, f"{where}: {section}.{key}", depth)


#: The sections that describe rather than configure, and how deep their values may nest:
#: ``hardware`` and ``study`` hold short scalars, ``workload`` a small mapping of options,
#: ``measured`` the evidence (intervals, screening and ablation tables, the limit).
_DESCRIPTIVE = {"study": 0, "hardware": 0, "workload": 2, "measured": 6}
#: The longest string a descriptive value may be.
MAX_TEXT = 1000
#: The most items of one list or mapping in a descriptive value.
MAX_ITEMS = 1000


def _check_small(value: Any, where: str, depth: int) -> None:
    """A short scalar, or (``depth`` > 0) a list or mapping of at most ``MAX_ITEMS`` such
    values nested ``depth`` deep."""
    if isinstance(value, str):
        if len(value) > MAX_TEXT:
            raise ConfigError(f"{where}: a text of {len(value)} characters; at most {MAX_TEXT}")
        return
    if value is None or isinstance(value, (bool, int, float)):
        return
    if not isinstance(value, (list, dict)):
        raise ConfigError(f"{where}: a {type(value).__name__}, not a number, text or flag")
    if depth <= 0:
        raise ConfigError(
            f"{where}: must be a number, a short text or a flag, not a {type(value).__name__}"
        )
    if len(value) > MAX_ITEMS:
        raise ConfigError(f"{where}: {len(value)} items; at most {MAX_ITEMS}")
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for k, v in items:
        _check_small(k, where, 0)
        _check_small(v, f"{where}.{k}" if isinstance(value, dict) else where, depth - 1)
