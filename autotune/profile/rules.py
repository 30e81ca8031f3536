"""What a profile may hold: its sections and keys, the environment variables it may set (an
allowlist), and the types and legal values of what autotune computes with.

A profile is untrusted input (a file from elsewhere, or a study in a shared database that
``autotune export`` reads). ``check_mapping`` is the whole check of a profile file's mapping,
``check_values`` the part that also holds for a profile built from a stored trial
configuration (``Profile.from_config``), ``shell_exports`` the only way autotune writes an
environment for a shell.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from typing import Any

from autotune.core import allocator
from autotune.core import safe_yaml as _yaml
from autotune.core.errors import ConfigError
from autotune.core.knobs import (
    COMM_HOOKS,
    KNOBS,
    PRECISIONS,
    UNSET,
    Knob,
    Target,
    illegal_combination,
)

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
    ),  # fmt: skip
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
    ),
    "ddp": ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "comm_hook"),
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
HOOK_KEYS = ("name", "matrix_approximation_rank", "start_powerSGD_iter")

#: The only environment variables a profile may set, each with the knob whose legality rule
#: its value must pass (written as a string): the NCCL knobs, OMP_NUM_THREADS (``threads``)
#: and glibc's two allocator thresholds (``autotune.core.allocator``: not searched, set alike in
#: every trial). Anything else (LD_PRELOAD, PYTHONPATH, a name that is shell syntax) is
#: refused at load.
ALLOWED_ENV: Mapping[str, Knob] = {
    "OMP_NUM_THREADS": KNOBS["threads"],
    **{name: k for name, k in KNOBS.items() if k.section == "nccl"},
    allocator.MMAP_ENV: Knob(
        name=allocator.MMAP_ENV, section="env", doc="glibc malloc's mmap threshold, pinned",
        default=UNSET, legal=allocator.legal_mmap,
    ),
    allocator.TRIM_ENV: Knob(
        name=allocator.TRIM_ENV, section="env", doc="glibc malloc's trim threshold, pinned",
        default=UNSET, legal=allocator.legal_trim,
    ),
}  # fmt: skip
#: How a file's problem is fixed (a study's: ``Profile.from_config``).
FILE_FIX = "correct it in the file or export the study again"
#: ``illegal_combination`` needs a target; its environment rules do not look at it.
_ANY_TARGET = Target(backend="nccl", device="cuda", world_size=1, global_batch=1, cpus_per_rank=1)


def _whole(lo: int) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= lo
        return None if ok else f"must be a whole number >= {lo}"

    return check


def _flag(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


#: The values autotune computes with or passes to torch: (section, key) -> why a value is wrong.
_RULES: dict[tuple[str, str], Callable[[Any], str | None]] = {
    ("workload", "world_size"): _whole(1),
    ("workload", "global_batch"): _whole(1),
    ("workload", "free_batch"): _flag,
    ("ddp", "bucket_cap_mb"): KNOBS["bucket_cap_mb"].legal,
    ("ddp", "gradient_as_bucket_view"): _flag,
    ("ddp", "static_graph"): _flag,
    ("ddp.comm_hook", "matrix_approximation_rank"): _whole(1),
    ("ddp.comm_hook", "start_powerSGD_iter"): _whole(0),
    ("data", "num_workers"): _whole(0),
    ("data", "pin_memory"): _flag,
    ("data", "prefetch_factor"): _whole(1),
    ("data", "persistent_workers"): _flag,
    ("batch", "micro_batch"): _whole(1),
    ("batch", "accumulation_steps"): _whole(1),
    ("batch", "global_batch"): _whole(1),
}


def _env_value(value: str) -> Any:
    """An environment string as the knob's rule sees it: digits are a whole number."""
    return int(value) if re.fullmatch(r"[0-9]{1,18}", value) else value


def check_env(env: Any, *, where: str = "profile", fix: str = FILE_FIX) -> None:
    """Refuse an ``env`` section that sets anything but ``ALLOWED_ENV``'s variables, a value
    that is not a string, or a value its knob's legality rule refuses; ``where`` and ``fix``
    go into the one-line ``ConfigError``."""
    if not isinstance(env, dict):
        raise ConfigError(
            f"{where}: env must map variable names to strings (quote numbers), got "
            f"{type(env).__name__}; {fix}"
        )
    for name, value in env.items():
        if name not in ALLOWED_ENV:
            raise ConfigError(
                f"{where}: env key {name!r} is not allowed: a profile sets only "
                f"{', '.join(ALLOWED_ENV)}; {fix}"
            )
        if not isinstance(value, str):
            raise ConfigError(
                f"{where}: env must map variable names to strings (quote numbers), got "
                f"{name}: {value!r}; {fix}"
            )
        if value == UNSET:
            reason: str | None = f"must not be {UNSET!r} (leave the key out to keep NCCL's)"
        else:
            reason = ALLOWED_ENV[name].legal(_env_value(value))
        if reason:
            reason = reason.removesuffix(f", or '{UNSET}' to leave it unset")
            raise ConfigError(f"{where}: env.{name} {reason}, got {value!r}; {fix}")
    nccl = {k: _env_value(v) for k, v in env.items() if k.startswith("NCCL_")}
    reason = illegal_combination(nccl, _ANY_TARGET)
    if reason:
        raise ConfigError(f"{where}: env: {reason}; {fix}")


def check_values(data: Mapping[str, Any], *, where: str, fix: str) -> None:
    """The env, the precision, the hook's name and every ``_RULES`` value that ``data`` holds
    (a profile's mapping, whole or in part)."""
    check_env(data.get("env", {}), where=where, fix=fix)
    ddp = data.get("ddp")
    sections = {**data, "ddp.comm_hook": ddp.get("comm_hook") if isinstance(ddp, dict) else None}
    for (section, key), rule in _RULES.items():
        values = sections.get(section)
        if isinstance(values, dict) and key in values:
            reason = rule(values[key])
            if reason:
                raise ConfigError(f"{where}: {section}.{key} {reason}, got {values[key]!r}; {fix}")
    hook = sections["ddp.comm_hook"]
    if isinstance(hook, dict) and "name" in hook and hook["name"] not in COMM_HOOKS:
        raise ConfigError(
            f"{where}: ddp.comm_hook.name must be one of {', '.join(COMM_HOOKS)}, got "
            f"{hook['name']!r}; {fix}"
        )
    if "precision" in data and data["precision"] not in PRECISIONS:
        raise ConfigError(
            f"{where}: precision must be one of {', '.join(PRECISIONS)}, got "
            f"{data['precision']!r}; {fix}"
        )


def shell_exports(env: Mapping[str, str]) -> str:
    """``export NAME=value`` lines for a POSIX shell to ``eval``, names and values quoted, so
    that ``eval`` sets exactly these strings and runs nothing else."""
    return "".join(f"export {shlex.quote(k)}={shlex.quote(v)}\n" for k, v in env.items())


def check_mapping(data: dict[str, Any], *, where: str = "profile") -> None:
    """A profile file's mapping: every section and key known and present where required, the
    version this autotune reads, every value by ``check_values``, and the batch arithmetic."""
    _yaml.check_keys(data, where=where, allowed=TOP, required=TOP)
    if data["version"] != PROFILE_VERSION:
        raise ConfigError(
            f"{where}: version {data['version']!r} is not supported; this autotune reads "
            f"version {PROFILE_VERSION} (export the study again)"
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
    _yaml.check_keys(hook, where=f"{where}: ddp.comm_hook", allowed=HOOK_KEYS, required=("name",))
    check_values(data, where=where, fix=FILE_FIX)
    b, w = data["batch"], data["workload"]
    if b["micro_batch"] * b["accumulation_steps"] * w["world_size"] != b["global_batch"]:
        raise ConfigError(
            f"{where}: batch.micro_batch x batch.accumulation_steps x workload.world_size "
            f"must equal batch.global_batch, got {b['micro_batch']} x "
            f"{b['accumulation_steps']} x {w['world_size']} != {b['global_batch']}"
        )
