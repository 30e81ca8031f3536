"""The exported profile: the best configuration of a study, with the evidence behind it.

Written at the end of every ``autotune run`` and by ``autotune export``; loaded back by the
same strict loader (``Profile.load``) that the user's training script uses::

    version: 1
    study:     {name, best_trial, baseline_trial}
    workload:  {trainer, options, world_size, backend, global_batch}
    hardware:  {device, device_name, device_count, node_count, torch, cuda, driver, nccl,
                nvlink, bf16_native}
    measured:  {baseline_samples_per_s, best_samples_per_s, speedup, speedup_interval,
                interval, validation, trials, budget, tuning_s, note, numerics_drift?,
                baseline_peak_memory_mb?, pareto?, batch_changed?, baseline_runs?,
                screening?, ablation?, limit?}
    env:       {NCCL_ALGO: Ring, OMP_NUM_THREADS: "1", ...}   # ALLOWED_ENV only, string values
    ddp:       {bucket_cap_mb, gradient_as_bucket_view, static_graph, comm_hook: {name, ...},
                compile?}
    data:      {num_workers, pin_memory, prefetch_factor?, persistent_workers?}
    precision: fp32 | tf32 | bf16 | fp16
    batch:     {micro_batch, accumulation_steps, global_batch}
"""

from __future__ import annotations

import os
import warnings
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.core import allocator, apply, step_report, values
from autotune.core import safe_yaml as _yaml
from autotune.core.config import POWERSGD_START_ITER, TrialConfig
from autotune.core.errors import ConfigError
from autotune.core.files import replace_whole
from autotune.core.values import is_int, precise, speedup_interval
from autotune.launch.hardware import differences
from autotune.profile.rules import (
    ALLOWED_ENV,
    PROFILE_VERSION,
    TOP,
    check_env,
    check_mapping,
    check_values,
    shell_exports,
)

__all__ = ["ALLOWED_ENV", "PROFILE_VERSION", "Profile", "check_env", "shell_exports"]


#: PyTorch's own values of the DDP settings a profile may leave out.
DDP_DEFAULTS: dict[str, Any] = {
    "bucket_cap_mb": 25.0,
    "gradient_as_bucket_view": False,
    "static_graph": False,
}


@dataclass(kw_only=True)
class Profile:
    """A tuned configuration and how it was measured."""

    version: int = PROFILE_VERSION
    study: dict[str, Any] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)
    hardware: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    ddp: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    precision: str = "fp32"
    batch: dict[str, Any] = field(default_factory=dict)

    # -- reading and writing -------------------------------------------------------------

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> Profile:
        """Load and check a profile; every unknown or missing key is an error naming it.
        Without ``path``: the file ``AUTOTUNE_PROFILE`` names, which ``autotune launch`` sets
        for the real job and ``autotune run ... -- CMD`` for each trial (script mode)."""
        if path is None:
            path = os.environ.get("AUTOTUNE_PROFILE")
            if not path:
                raise ConfigError(
                    "Profile.load(): no path given and AUTOTUNE_PROFILE is not set; pass the "
                    "profile's path, or start the script with autotune launch PROFILE -- CMD"
                )
        p = Path(path)
        return cls.from_mapping(_yaml.read_mapping(p, what="profile"), where=f"profile {p}")

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, where: str = "profile") -> Profile:
        """A checked mapping as a profile; a DDP setting it leaves out is PyTorch's default
        (``DDP_DEFAULTS``), and PowerSGD's start its own (``POWERSGD_START_ITER``), so that
        every consumer (``wrap``, ``export --format``) reads one value for each."""
        check_mapping(data, where=where)
        fields = {k: data[k] for k in TOP}
        ddp = {**DDP_DEFAULTS, **fields["ddp"]}
        if ddp["comm_hook"].get("name") == "powersgd":
            ddp["comm_hook"] = {"start_powerSGD_iter": POWERSGD_START_ITER, **ddp["comm_hook"]}
        fields["ddp"] = ddp
        return cls(**fields)

    def to_yaml(self, *, where: str = "profile") -> str:
        """The profile as its file holds it, checked by the strict loader first: nothing is
        written that ``load`` would refuse."""
        mapping = self.to_mapping()
        Profile.from_mapping(mapping, where=where)
        return _HEADER + _yaml.dump(mapping)

    def to_mapping(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in TOP}

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write atomically: a reader never sees half a profile, nor one ``load`` refuses."""
        p = Path(path)
        text = self.to_yaml(where=f"profile {p}")
        p.parent.mkdir(parents=True, exist_ok=True)
        return replace_whole(p, lambda f: f.write(text.encode()), ordinary_mode=False)

    # -- using it ----------------------------------------------------------------------------

    @property
    def ddp_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``DistributedDataParallel`` (the hook is registered apart, and
        ``compile`` is applied by ``wrap``)."""
        return {k: v for k, v in self.ddp.items() if k not in ("comm_hook", "compile")}

    @property
    def compile(self) -> str:
        """The ``torch.compile`` mode ``wrap`` compiles the model with, ``none`` for none."""
        return str(self.ddp.get("compile", "none"))

    @property
    def comm_hook(self) -> dict[str, Any]:
        """The communication hook ``wrap`` registers: ``{name: none|fp16|bf16|powersgd, ...}``."""
        return dict(self.ddp["comm_hook"])

    @property
    def dataloader_kwargs(self) -> dict[str, Any]:
        """``DataLoader`` kwargs, ``batch_size`` (the tuned micro-batch) included."""
        return apply.dataloader_kwargs(self.batch["micro_batch"], self.data)

    @property
    def accumulation_steps(self) -> int:
        """Micro-steps per optimizer step; run ``no_sync()`` on all but the last."""
        return int(self.batch["accumulation_steps"])

    def headline(self) -> str:
        """What the profile stands for, in one line: its speedup over the defaults, with the
        re-validation's interval where there was one."""
        m = self.measured
        speedup, ci = m.get("speedup"), m.get("speedup_interval")
        if m.get("validation") and ci:
            if ci == [1.0, 1.0]:
                return "the defaults: no candidate beat them beyond the noise in the re-validation"
            rounds = (m.get("validation") or {}).get("rounds")
            said = speedup_interval(speedup, ci[0], ci[1], rounds if is_int(rounds) else None)
            if not precise(speedup, ci[0], ci[1]):
                return f"re-validated against the defaults: {said}"
            return f"{said} over the defaults (re-validated, 95 % interval)"
        return f"{values.speedup(speedup)} the defaults ({m.get('note', 'not re-validated')})"

    def hardware_differences(self) -> list[str]:
        """How this process's hardware differs from where the profile was measured."""
        from autotune.launch.hardware import describe

        return differences(self.hardware, describe(self.workload.get("backend", "gloo")))

    def machine_warnings(self, cpus: int | None = None) -> list[str]:
        """What the profile asks beyond this machine (``cpus``: its CPUs, by default those
        this process may run on): more DataLoader workers or threads per rank than it has
        CPUs. Within ``autotune.core.bounds`` such a profile is legal - a job may use fewer
        ranks per node than the profile's - so it is warned about, not refused."""
        cpus = cpus or len(os.sched_getaffinity(0))
        out = []
        workers = self.data.get("num_workers", 0)
        if workers > cpus:
            out.append(f"data.num_workers {workers} per rank, on {cpus} CPU(s)")
        threads = int(self.env.get("OMP_NUM_THREADS", "1"))
        if threads > cpus:
            out.append(f"env.OMP_NUM_THREADS {threads} per rank, on {cpus} CPU(s)")
        return out

    def warn_if_hardware_differs(self) -> list[str]:
        for line in self.machine_warnings():
            warnings.warn(
                f"profile {self.study.get('name')!r} asks more than this machine has: {line}",
                stacklevel=3,
            )
        diffs = self.hardware_differences()
        if diffs:
            warnings.warn(
                f"profile {self.study.get('name')!r} was measured on other hardware ("
                + "; ".join(diffs)
                + "); its speedup may not hold here",
                stacklevel=3,
            )
        return diffs

    def apply_env(self, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
        """Put the profile's environment into ``environ`` (default ``os.environ``).

        Call it before ``init_process_group``: NCCL reads its variables once per process.
        Into ``os.environ`` it also applies ``OMP_NUM_THREADS`` (torch's threads) and glibc's
        allocator thresholds (``autotune.core.allocator.pin``) to this process at once. Returns the
        variables set: only ``ALLOWED_ENV``'s, each value legal (checked again).
        """
        import torch.distributed as dist

        check_env(self.env, where=f"profile {self.study.get('name')!r}")
        if dist.is_available() and dist.is_initialized():
            warnings.warn(
                "apply_env() after init_process_group: NCCL has already read its variables; "
                "call it first (or run the script under `autotune launch`)",
                stacklevel=2,
            )
        target = os.environ if environ is None else environ
        target.update(self.env)
        if environ is None and "OMP_NUM_THREADS" in self.env:
            apply.set_threads(int(self.env["OMP_NUM_THREADS"]))
        if environ is None:  # glibc read its variables when the process started: mallopt now
            allocator.pin({k: v for k, v in self.env.items() if k in allocator.ENV})
        return dict(self.env)

    def wrap(self, model: Any, **ddp_kwargs: Any) -> Any:
        """``DistributedDataParallel(model)`` with the tuned kwargs and comm hook; with a
        ``ddp.compile`` mode, DDP wraps ``torch.compile(model, mode=..., dynamic=False)``
        (``apply.compile_model``: a mode this machine cannot run is a ``ConfigError`` saying
        why). Compilation happens in the first steps; the state dict's keys then carry
        torch.compile's ``_orig_mod.`` prefix.

        Extra keyword arguments (``device_ids=[local_rank]``) go to DDP as well. Warns when the
        hardware differs from where the profile was measured.
        """
        self.warn_if_hardware_differs()
        tuned = {**self.ddp_kwargs, "compile": self.compile}
        wrapped = apply.wrap(model, tuned, self.comm_hook, **ddp_kwargs)
        # only in a trial of autotune run ... -- CMD
        step_report.install(wrapped, hook_free=self.comm_hook.get("name", "none") == "none")
        return wrapped

    def report_loss(self, loss: Any) -> None:
        """Optional: hand the step's loss to ``autotune run ... -- CMD`` (its NaN check and
        numerics guard); nothing outside such a trial. ``float(loss)`` waits for the GPU."""
        step_report.report_loss(loss)

    def autocast(self, device_type: str = "cuda") -> Any:
        """The tuned precision as a context for the forward pass and loss. TF32 is a process
        flag instead: switched on for ``tf32`` (``apply.set_tf32``); for every other precision
        the script's own TF32 settings are left as they are."""
        if self.precision == "tf32":
            apply.set_tf32(True)
        return apply.autocast(self.precision, device_type)

    def grad_scaler(self, device_type: str = "cuda") -> Any:
        """A ``GradScaler``, enabled only for fp16."""
        return apply.grad_scaler(self.precision, device_type)

    def trial_config(self) -> TrialConfig:
        """The configuration as a trial runs it."""
        threads = int(self.env.get("OMP_NUM_THREADS", "1"))
        return TrialConfig(
            env=dict(self.env),
            ddp={k: v for k, v in self.ddp.items() if k != "comm_hook"},
            comm_hook=self.comm_hook,
            data=dict(self.data),
            precision=self.precision,
            micro_batch=self.batch["micro_batch"],
            accumulation_steps=self.batch["accumulation_steps"],
            global_batch=self.batch["global_batch"],
            threads=threads,
        )

    @classmethod
    def from_config(cls, config: TrialConfig, *, where: str = "", **sections: Any) -> Profile:
        """The profile of a trial's configuration, checked as ``load`` checks a file's values
        (the configuration may come from someone else's study): a ``ConfigError`` names
        ``where`` (by default the study and trial of ``sections['study']``) and the key."""
        study = sections.get("study") or {}
        if not where and "name" in study:
            trial = study.get("best_trial")
            where = f"study {study['name']!r}" + ("" if trial is None else f" trial {trial}")
        where = where or "profile"
        fix = EXPORT_FIX
        for name in ("env", "ddp", "comm_hook", "data"):
            if not isinstance(getattr(config, name), dict):
                raise ConfigError(f"{where}: config.{name} must be a mapping; {fix}")
        profile = cls(
            env=dict(config.env),
            ddp={**config.ddp, "comm_hook": dict(config.comm_hook)},
            data=dict(config.data),
            precision=config.precision,
            batch={
                "micro_batch": config.micro_batch,
                "accumulation_steps": config.accumulation_steps,
                "global_batch": config.global_batch,
            },
            **sections,
        )
        check_values(profile.to_mapping(), where=where, fix=fix)
        return profile


#: How a study's configuration that fails the check is dealt with when exporting it.
EXPORT_FIX = "autotune never writes this; export another trial (--trial N)"

_HEADER = (
    "# autotune profile: the best configuration the study measured, and the evidence.\n"
    "# Apply it with autotune.Profile.load(path); see the README.\n"
)
