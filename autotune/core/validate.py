"""The one check of a configuration that will run, whatever it came from.

A configuration reaches a rank or a user's command from a search space, from a stored trial
of a study (resuming someone's ``.db``, a shared PostgreSQL study: re-validation, ablation,
the limit probe and ``export`` run what the study holds), from a profile file or
``AUTOTUNE_PROFILE``. All of it is untrusted input, and all of it passes ``check_config``:

* the environment sets only ``ALLOWED_ENV``'s variables (the NCCL knobs, ``OMP_NUM_THREADS``
  and glibc's two allocator thresholds), each a string its knob's rule accepts: no
  ``LD_PRELOAD``, ``NCCL_NET_PLUGIN``, ``PATH`` or ``GLOO_SOCKET_IFNAME``;
* every other section holds only its known keys, each of the right type and inside the
  absolute bounds of ``autotune.core.bounds``;
* the batch arithmetic holds;
* ``ddp.compile``, a ``torch.compile`` mode, is one of ``core.compiling.MODES`` and not with
  buckets below DDPOptimizer's first bucket. Whether it can run is a question of the machine,
  not of the file: ``check_compile`` asks it where the model is wrapped (``core.apply.wrap``),
  by the same rules that leave the knob out of a study there.

A configuration that fails is a ``ConfigError`` naming ``where`` (the study and trial, or the
profile file) and the key, in one line. The launcher checks again right before a trial runs,
and applies its own listen settings (loopback) after the configuration's environment.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from autotune.core import allocator, bounds, compiling
from autotune.core.errors import ConfigError
from autotune.core.knobs import COMM_HOOKS, KNOBS, UNSET, Knob, illegal_combination
from autotune.core.target import Target
from autotune.core.values import boolean, int_range, one_of, shown

__all__ = [
    "ALLOWED_ENV",
    "DATA_KEYS",
    "DDP_KEYS",
    "FILE_FIX",
    "HOOK_KEYS",
    "check_config",
    "check_compile",
    "check_env",
    "check_sections",
]

#: The only environment variables a configuration may set, each with the knob whose legality
#: rule its value must pass (written as a string): the NCCL knobs, OMP_NUM_THREADS
#: (``threads``) and glibc's two allocator thresholds (``autotune.core.allocator``: not
#: searched, set alike in every trial). Anything else is refused.
ALLOWED_ENV: Mapping[str, Knob] = {
    "OMP_NUM_THREADS": KNOBS["threads"],
    **{name: k for name, k in KNOBS.items() if k.section == "nccl"},
    allocator.MMAP_ENV: Knob(
        name=allocator.MMAP_ENV,
        section="env",
        doc="glibc malloc's mmap threshold, pinned",
        default=UNSET,
        legal=allocator.legal_mmap,
    ),
    allocator.TRIM_ENV: Knob(
        name=allocator.TRIM_ENV,
        section="env",
        doc="glibc malloc's trim threshold, pinned",
        default=UNSET,
        legal=allocator.legal_trim,
    ),
}
#: DistributedDataParallel keyword arguments a configuration may carry.
DDP_KEYS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "compile")
#: A communication hook's keys.
HOOK_KEYS = ("name", "matrix_approximation_rank", "start_powerSGD_iter")
#: DataLoader keyword arguments a configuration may carry.
DATA_KEYS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
#: How a file's problem is fixed.
FILE_FIX = "correct it in the file or export the study again"
#: ``illegal_combination`` needs a target; its environment rules do not look at it.
_ANY_TARGET = Target(backend="nccl", device="cuda", world_size=1, global_batch=1, cpus_per_rank=1)

Rule = Callable[[Any], "str | None"]
#: (section as the profile names it, key) -> the rule its value keeps.
_RULES: dict[tuple[str, str], Rule] = {
    **{("ddp", k): KNOBS[k].legal for k in DDP_KEYS},
    ("ddp.comm_hook", "name"): one_of(COMM_HOOKS),
    ("ddp.comm_hook", "matrix_approximation_rank"): KNOBS["powersgd_rank"].legal,
    ("ddp.comm_hook", "start_powerSGD_iter"): int_range(0, bounds.MAX_POWERSGD_START),
    ("data", "num_workers"): KNOBS["num_workers"].legal,
    ("data", "pin_memory"): boolean,
    ("data", "prefetch_factor"): KNOBS["prefetch_factor"].legal,
    ("data", "persistent_workers"): boolean,
    ("batch", "micro_batch"): KNOBS["micro_batch"].legal,
    ("batch", "accumulation_steps"): int_range(1, bounds.MAX_ACCUMULATION),
    ("batch", "global_batch"): int_range(1, bounds.MAX_GLOBAL_BATCH),
    ("threads", "threads"): KNOBS["threads"].legal,
    ("precision", "precision"): KNOBS["precision"].legal,
}
_KEYS = {"ddp": DDP_KEYS, "ddp.comm_hook": HOOK_KEYS, "data": DATA_KEYS}


def _env_value(value: str) -> Any:
    """An environment string as the knob's rule sees it: digits in canonical decimal are a
    whole number; anything else stays text, which a number's rule refuses. NCCL reads its
    integers with base 0 (``strtoll(value, NULL, 0)``): ``09`` is 0 and ``0064`` is 52 there,
    so a leading zero is not the number it looks like."""
    return int(value) if re.fullmatch(r"0|[1-9][0-9]{0,17}", value) else value


def check_env(env: Any, *, where: str = "profile", fix: str = FILE_FIX) -> None:
    """Refuse an ``env`` that sets anything but ``ALLOWED_ENV``'s variables, a value that is
    not a string, or a value its knob's legality rule refuses; ``where`` and ``fix`` go into
    the one-line ``ConfigError``."""
    if not isinstance(env, dict):
        raise ConfigError(
            f"{where}: env must map variable names to strings (quote numbers), got "
            f"{type(env).__name__}; {fix}"
        )
    for name, value in env.items():
        if name not in ALLOWED_ENV:
            raise ConfigError(
                f"{where}: env key {shown(name)} is not allowed: a configuration sets only "
                f"{', '.join(ALLOWED_ENV)}; {fix}"
            )
        if not isinstance(value, str):
            raise ConfigError(
                f"{where}: env must map variable names to strings (quote numbers), got "
                f"{name}: {shown(value)}; {fix}"
            )
        if value == UNSET:
            reason: str | None = f"must not be {UNSET!r} (leave the key out to keep NCCL's)"
        else:
            reason = ALLOWED_ENV[name].legal(_env_value(value))
        if reason:
            reason = reason.removesuffix(f", or '{UNSET}' to leave it unset")
            raise ConfigError(f"{where}: env.{name} {reason}, got {shown(value)}; {fix}")
    nccl = {k: _env_value(v) for k, v in env.items() if k.startswith("NCCL_")}
    reason = illegal_combination(nccl, _ANY_TARGET)
    if reason:
        raise ConfigError(f"{where}: env: {reason}; {fix}")


def check_sections(sections: Mapping[str, Any], *, where: str, fix: str) -> None:
    """Each section of ``sections`` (``ddp``, ``ddp.comm_hook``, ``data``, ``batch``,
    ``threads``, ``precision``: mappings named as the profile names them) holds only its known
    keys, each value by its rule."""
    for section, keys in _KEYS.items():
        value = sections.get(section)
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {section} must be a mapping, got {shown(value)}; {fix}")
        for key in value:
            if key not in keys:
                raise ConfigError(
                    f"{where}: {section}: unknown key {shown(key)}; allowed keys are "
                    f"{', '.join(keys)}; {fix}"
                )
    for (section, key), rule in _RULES.items():
        values = sections.get(section)
        if isinstance(values, dict) and key in values:
            reason = rule(values[key])
            if reason:
                name = section if section == key else f"{section}.{key}"
                raise ConfigError(f"{where}: {name} {reason}, got {shown(values[key])}; {fix}")


def check_config(config: Any, *, where: str = "configuration", fix: str = FILE_FIX) -> None:
    """The whole check of a ``TrialConfig`` (see the module doc)."""
    check_env(config.env, where=where, fix=fix)
    check_sections(
        {
            "ddp": config.ddp,
            "ddp.comm_hook": config.comm_hook,
            "data": config.data,
            "batch": {
                "micro_batch": config.micro_batch,
                "accumulation_steps": config.accumulation_steps,
                "global_batch": config.global_batch,
            },
            "threads": {"threads": config.threads},
            "precision": {"precision": config.precision},
        },
        where=where,
        fix=fix,
    )
    if "name" not in config.comm_hook:
        raise ConfigError(f"{where}: ddp.comm_hook has no name; {fix}")
    omp = config.env.get("OMP_NUM_THREADS")
    if omp is not None and int(omp) != config.threads:
        raise ConfigError(
            f"{where}: env.OMP_NUM_THREADS {omp} differs from threads {config.threads}; {fix}"
        )
    reason = compiling.combination_problem(
        config.ddp.get("compile"), config.ddp.get("bucket_cap_mb")
    )
    if reason:
        raise ConfigError(f"{where}: ddp.compile: {reason}; {fix}")
    per_step = config.micro_batch * config.accumulation_steps
    if config.global_batch % per_step or config.global_batch // per_step > bounds.MAX_WORLD_SIZE:
        raise ConfigError(
            f"{where}: batch.global_batch {config.global_batch} is not micro_batch x "
            f"accumulation_steps ({per_step}) x a world size of at most "
            f"{bounds.MAX_WORLD_SIZE}; {fix}"
        )


def check_compile(
    mode: Any,
    device: str,
    bucket_cap_mb: Any = None,
    *,
    where: str = "configuration",
    fix: str = FILE_FIX,
) -> None:
    """Refuse a ``torch.compile`` ``mode`` that cannot run in this process on ``device``, or
    not with DDP buckets of ``bucket_cap_mb`` MiB (the rules of the ``compile`` knob,
    ``core.compiling``: a study there leaves it out for the same reason); nothing for
    ``none``."""
    if mode == compiling.NONE:
        return
    reason = KNOBS["compile"].legal(mode)
    reason = reason and f"{reason}, got {shown(mode)}"
    reason = reason or compiling.problem(device) or compiling.choice_problem(mode, device)
    reason = reason or compiling.combination_problem(mode, bucket_cap_mb)
    if reason:
        raise ConfigError(f"{where}: ddp.compile {mode!r} cannot run here: {reason}; {fix}")
