"""What the framework adapters share: the ``Mapping`` of a profile's knobs onto a framework's
arguments, the batch arithmetic, the communication hook as torch's objects, and the lines a
rendered snippet starts with.

Nothing here imports torch or a framework at module level; ``autotune.core`` only.
"""

from __future__ import annotations

import atexit
import textwrap
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.core import apply, values
from autotune.core.config import POWERSGD_START_ITER
from autotune.core.errors import ConfigError
from autotune.core.knobs import KNOBS

if TYPE_CHECKING:
    from autotune.profile.profile import Profile

__all__ = [
    "DATA_KNOBS",
    "DDP_KNOBS",
    "ENV_FIX",
    "HOOK_IMPORT",
    "TF32_LINES",
    "PROFILE_FILE",
    "Mapping",
    "batch",
    "compile_mapping",
    "data_mapping",
    "dataloader_kwargs",
    "drain_at_exit",
    "env_knobs",
    "header",
    "hook_label",
    "torch_hook",
]

#: The profile's file as a rendered snippet names it (``render`` has no path).
PROFILE_FILE = "best.yaml"
#: How a knob that is an environment variable reaches the job, whatever the framework.
ENV_FIX = (
    'start the job with `autotune launch PROFILE -- CMD`, or `eval "$(autotune env PROFILE)"` '
    "in its shell first"
)
#: A snippet's import of torch's hooks.
HOOK_IMPORT = "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook"
#: A snippet's lines for the ``tf32`` precision (``autotune.core.apply.set_tf32(True)``).
TF32_LINES = [
    "torch.backends.cuda.matmul.allow_tf32 = True  # precision tf32",
    "torch.backends.cudnn.allow_tf32 = True",
]
#: The knobs that are ``DistributedDataParallel`` kwargs (the hook is registered apart).
DDP_KNOBS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph")
#: The knobs of the data section, in the order of ``DataLoader``'s arguments.
DATA_KNOBS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
#: The widest comment line of a snippet.
COMMENT_WIDTH = 99
_DRAIN: list[bool] = []


def env_knobs() -> dict[str, str]:
    """Knob -> the environment variable that carries it: every NCCL knob (its own name) and
    ``threads`` (``OMP_NUM_THREADS``). No framework argument sets these: NCCL and OpenMP read
    them when the process starts."""
    out = {name: name for name, k in KNOBS.items() if k.section == "nccl"}
    out["threads"] = "OMP_NUM_THREADS"
    return out


@dataclass(frozen=True)
class Mapping:
    """How one profile's knobs land in one framework: ``mapped`` knob -> the argument that
    carries it; ``unmapped`` knob -> why no argument does, and how to apply it anyway. Every
    knob of ``autotune.core.knobs.KNOBS`` is in exactly one of the two."""

    framework: str
    mapped: dict[str, str] = field(default_factory=dict)
    unmapped: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, framework: str, mapped: dict[str, str], unmapped: dict[str, str]) -> Mapping:
        """The framework's own classification, plus the environment knobs (unmapped in every
        framework). A knob in both, or an environment knob mapped, is a bug of the adapter."""
        env = {
            k: f"environment variable {var}: no {framework} argument sets it; {ENV_FIX}"
            for k, var in env_knobs().items()
        }
        both = (set(mapped) & set(unmapped)) | (set(mapped) & set(env))
        if both:
            raise ValueError(f"{framework}: knobs both mapped and unmapped: {sorted(both)}")
        return cls(framework, dict(mapped), {**unmapped, **env})

    def unclassified(self) -> list[str]:
        """The knobs this mapping says nothing about (none, for a correct adapter)."""
        return sorted(set(KNOBS) - set(self.mapped) - set(self.unmapped))

    def comment(self) -> list[str]:
        """The mapping as comment lines of a snippet, each at most ``COMMENT_WIDTH`` wide."""
        env = env_knobs()
        rows = [f"Mapped ({self.framework}):"]
        rows += [f"  {k}: {v}" for k, v in self.mapped.items()]
        rows.append("Not mapped (no argument of this framework carries them):")
        rows += [f"  {k}: {v}" for k, v in self.unmapped.items() if k not in env]
        names = ", ".join(k for k in self.unmapped if k in env)
        rows.append(f"  {names}: environment variables; {ENV_FIX}")
        return [
            line
            for row in rows
            for line in textwrap.wrap(
                row,
                COMMENT_WIDTH,
                initial_indent="# ",
                subsequent_indent="#   " + " " * (len(row) - len(row.lstrip())),
                break_on_hyphens=False,
            )
        ]


def batch(profile: Profile, world_size: int | None = None) -> tuple[int, int]:
    """(micro-batch per rank, accumulation steps) of the profile, at its global batch.

    The profile keeps the global batch ``micro_batch x accumulation_steps x world_size`` of the
    study fixed. On another ``world_size`` the accumulation steps are recomputed to keep it; a
    ConfigError says when they cannot be (the global batch does not split), or when they would
    accumulate under ``static_graph`` (torch's reducer asserts). A ``--free-batch`` study's
    global batch follows the micro-batch: its per-rank settings are kept as they are."""
    micro, steps = int(profile.batch["micro_batch"]), int(profile.batch["accumulation_steps"])
    measured = profile.workload.get("world_size")
    if world_size is None or world_size == measured or profile.workload.get("free_batch"):
        return micro, steps
    if world_size < 1:
        raise ConfigError(f"world_size must be a whole number >= 1, got {world_size!r}")
    total = int(profile.batch["global_batch"])
    if total % (micro * world_size):
        raise ConfigError(
            f"the profile's global batch {total} is not a whole number of micro-batches of "
            f"{micro} on {world_size} ranks; keep the study's {measured} ranks or tune again"
        )
    steps = total // (micro * world_size)
    if steps > 1 and profile.ddp.get("static_graph"):
        raise ConfigError(
            f"{world_size} ranks need {steps} accumulation steps to keep the global batch "
            f"{total}, and static_graph cannot accumulate; keep {measured} ranks or tune again"
        )
    return micro, steps


def dataloader_kwargs(profile: Profile, world_size: int | None = None) -> dict[str, Any]:
    """``DataLoader`` kwargs: ``batch_size`` (the micro-batch) and the data section
    (``num_workers``, ``pin_memory``, ``prefetch_factor``, ``persistent_workers``)."""
    micro, _ = batch(profile, world_size)
    return apply.dataloader_kwargs(micro, dict(profile.data))


def compile_mapping(profile: Profile, how: str) -> tuple[dict[str, str], dict[str, str]]:
    """(mapped, unmapped) of the ``compile`` knob: mapped when the profile compiles nothing
    (no framework compiles by default); else unmapped with ``how`` (``{mode}`` filled in):
    autotune compiled the model before DDP wrapped it, which no framework argument does."""
    mode = str(profile.ddp.get("compile", "none"))
    if mode == "none":
        return {"compile": "none: the model is not compiled (no framework compiles by default)"}, {}
    return {}, {"compile": how.format(mode=mode)}


def data_mapping(profile: Profile, form: str = "DataLoader({k}={v!r})") -> dict[str, str]:
    """The data knobs as ``form`` writes each argument; ``prefetch_factor`` and
    ``persistent_workers`` without workers (the profile leaves them out) are left unset."""
    data = profile.data
    return {
        k: form.format(k=k, v=data[k])
        if k in data
        else "left unset: no workers (DataLoader takes them only with workers)"
        for k in DATA_KNOBS
    }


def hook_label(profile: Profile) -> str:
    """The profile's communication hook as torch names it, with PowerSGD's options."""
    hook = profile.ddp["comm_hook"]
    name = hook["name"]
    if name == "powersgd":
        return (
            f"powerSGD_hook (PowerSGDState matrix_approximation_rank="
            f"{hook['matrix_approximation_rank']}, start_powerSGD_iter="
            f"{hook.get('start_powerSGD_iter', POWERSGD_START_ITER)})"
        )
    return {"none": "none", "fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook"}[name]


def torch_hook(profile: Profile) -> tuple[Any, Callable[..., Any]] | None:
    """(state, hook) of the profile's communication hook, as ``DistributedDataParallel.
    register_comm_hook`` takes them and as ``autotune.core.apply.register_comm_hook``
    registers them in a trial; None for ``none``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    hook = profile.ddp["comm_hook"]
    name = hook["name"]
    if name == "none":
        return None
    if name == "fp16":
        return None, default_hooks.fp16_compress_hook
    if name == "bf16":
        return None, default_hooks.bf16_compress_hook
    if name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=hook["matrix_approximation_rank"],
            start_powerSGD_iter=hook.get("start_powerSGD_iter", POWERSGD_START_ITER),
        )
        return state, powerSGD_hook.powerSGD_hook
    raise ConfigError(f"unknown comm hook {name!r}")


def drain_at_exit() -> None:
    """Register ``autotune.core.apply.drain_torch_threads`` at exit, once per process (as
    ``Profile.wrap`` does): a framework that wraps the model itself skips ``wrap``, and a gloo
    worker thread releasing the last all-reduce can otherwise abort the interpreter at exit."""
    if not _DRAIN and threading.current_thread() is threading.main_thread():
        _DRAIN.append(True)
        atexit.register(apply.drain_torch_threads)


def literal(value: Any) -> str:
    """A profile's value as generated code writes it: the ``repr`` of an int, float, bool or
    None, and of anything else as text, so that no character of it (a newline, a carriage
    return, a Unicode line separator, a quote) can end the literal or the comment it is in."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    return repr(str(value))


def printable(text: str) -> str:
    """``text`` with every character that is not printable escaped as Python writes it
    (``\\n``, ``\\r``, ``\\u2028``): safe inside a comment line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def header(profile: Profile, framework: str, fmt: str) -> list[str]:
    """The first comment lines of a snippet: what the profile is, and how its environment
    (the NCCL variables, ``OMP_NUM_THREADS``, glibc's allocator pin) reaches the job. Every
    value from the profile is written as a literal (``literal``) or escaped (``printable``):
    a profile may come from someone else."""
    study, measured = profile.study, profile.measured
    speedup = measured.get("speedup")
    shown = (
        f"{values.speedup(speedup)} the defaults"
        if isinstance(speedup, (int, float))
        else "measured"
    )
    env = printable(" ".join(f"{k}={v}" for k, v in profile.env.items())) or "(none)"
    return [
        f"# {framework} settings of autotune profile {literal(study.get('name'))} "
        f"(trial {literal(study.get('best_trial'))}: {shown}).",
        f"# Generated by `autotune export --format {fmt}`; {PROFILE_FILE} is the profile's file.",
        "#",
        "# The environment is not a framework argument: start the job with",
        f"#   autotune launch {PROFILE_FILE} -- torchrun --nproc-per-node N train.py",
        f'# or, in a shell or SLURM script:  eval "$(autotune env {PROFILE_FILE})"',
        *textwrap.wrap(
            f"It sets: {env}",
            COMMENT_WIDTH,
            initial_indent="# ",
            subsequent_indent="#   ",
            break_on_hyphens=False,
        ),
    ]
