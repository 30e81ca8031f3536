"""Study definitions: which trainer, world size, backend, space, objective, budget.

A definition is a YAML file in ``studies/`` (picked by name: ``--study default``) or anywhere
(``--study path/to/mine.yaml``). Each setting below is declared once, with ``setting(...)``
(``autotune.definition.settings``): its key in the file, its ``autotune run`` flag that overrides
it, its
default, its rule and its one line of help.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autotune.core import safe_yaml as _yaml
from autotune.core.config import MeasureSettings
from autotune.core.numerics import DEFAULT_TOLERANCE
from autotune.definition import settings
from autotune.definition.kinds import (
    DURATION,
    SIZE,
    Choice,
    Nested,
    Number,
    Options,
    Switch,
    Text,
    Whole,
)
from autotune.definition.settings import SettingError, setting

__all__ = [
    "BACKENDS",
    "NODE_WAIT_S",
    "OBJECTIVES",
    "PLACEMENTS",
    "SAMPLERS",
    "StudyDefinition",
    "available_studies",
]

BUILTIN_PACKAGE = "autotune.studies"
SAMPLERS = ("tpe", "gp", "random", "cmaes", "grid")
BACKENDS = ("auto", "gloo", "nccl")
#: Ray placement-group strategies for one trial's ranks.
PLACEMENTS = ("pack", "spread", "strict_pack", "strict_spread")
OBJECTIVES = ("throughput", "throughput,memory")
#: How long a trial whose node was lost waits for its placement group to be placed again
#: (``--node-wait``'s default; ``launch.launcher.TrialRunner``'s).
NODE_WAIT_S = 30.0


def _study_measure(m: MeasureSettings) -> str | None:
    """What a study asks of its measurement beyond MeasureSettings' own rules."""
    if m.min_windows < 2:
        return f"needs min_windows >= 2 (an interval needs two windows), got {m.min_windows}"
    return None


@dataclass(frozen=True, kw_only=True)
class StudyDefinition:
    """A ready study: what to tune and how long; checked when made."""

    name: str
    """The definition's name (its file's stem); the default study name builds on it."""
    origin: str = field(default="", compare=False, repr=False)
    """Where it was read (``study definition PATH``): what its errors name."""
    description: str = setting(
        "",
        Text(what="one line of text", empty=True),
        flag=None,
        help="one line for autotune studies",
    )
    trainer: str = setting(
        "mlp",
        Text(what="a trainer name or package.module:function"),
        required=True,
        help="built-in trainer name or package.module:function",
    )
    trainer_options: dict[str, Any] = setting(
        {},
        Options(),
        flag="--trainer-option",
        help="keyword option of the trainer function, repeatable (e.g. width=1024); the "
        "study's own options are kept unless --trainer names another trainer",
    )
    global_batch: int | None = setting(
        None,
        Whole(low=1),
        unset="the trainer's",
        help="samples per optimizer step over all ranks, kept for every trial; script mode "
        "(autotune run ... -- CMD) needs it, a built-in trainer takes its own",
    )
    world_size: int | None = setting(
        None, Whole(low=1), unset="one per GPU with nccl, 2 with gloo", help="DDP ranks per trial"
    )
    nodes: int | None = setting(
        None,
        Whole(low=1),
        unset="torchrun's --nnodes, else 1",
        help="script mode: the nodes one trial's torchrun spans, --nproc-per-node ranks on each "
        "(autotune starts it on every node with its node rank and a rendezvous on the first)",
    )
    backend: str = setting(
        "auto",
        Choice(options=BACKENDS),
        help="process-group backend; auto: nccl when the Ray cluster has GPUs, else gloo",
    )
    space: str = setting(
        "default",
        Text(what="a search space name or a YAML file"),
        metavar="SPACE",
        help="search space: a name from search_spaces/ or a YAML file",
    )
    objective: str = setting(
        "throughput",
        Choice(options=OBJECTIVES),
        help="throughput: samples/s over all ranks; throughput,memory: a Pareto front of "
        "samples/s and peak memory per rank, the profile chosen from it by a stated rule",
    )
    budget_s: float = setting(
        600.0,
        DURATION,
        key="budget",
        help="wall-clock time one invocation may run, counted from the command's start: 90s, "
        "10m, 2h, 1h30m or HH:MM:SS (SLURM's 01:30:00); a bare number is seconds; running it "
        "again resumes the same study with a fresh budget and keeps its trials",
    )
    n_trials: int | None = setting(
        None,
        Whole(low=1),
        metavar="N",
        unset="no limit",
        help="stop launching trials after N trials of this invocation (the baseline and failed "
        "trials count), or when the budget is spent, whichever comes first",
    )
    patience: int | None = setting(
        None,
        Whole(low=1),
        metavar="N",
        unset="never",
        help="stop launching trials once N trials in a row have not beaten the best so far",
    )
    sampler: str = setting("tpe", Choice(options=SAMPLERS), help="the Optuna sampler")
    screening: bool = setting(
        True,
        Switch(),
        help="start with the designed screening (each high-prior knob moved alone from the "
        "defaults, then the helpful ones combined) before the sampler proposes trials",
    )
    early_stop: bool = setting(
        True,
        Switch(),
        help="end the search once it has converged: for 5 trials in a row, a GP over the "
        "trials so far bounds what any unmeasured point could still gain within the measured "
        "noise; the rest of the budget is returned",
    )

    seed: int | None = setting(None, Whole(), unset="none", help="sampler and data seed")
    trial_timeout_s: float | None = setting(
        None,
        DURATION,
        key="trial_timeout",
        unset="4x the baseline trial's duration, at least 30s",
        help="kill a trial after this long",
    )
    measure: MeasureSettings = setting(
        MeasureSettings(),
        Nested(cls=MeasureSettings, rule=_study_measure),
        flag=None,
        help="warm-up and timed-window settings (autotune.core.config.MeasureSettings)",
    )
    max_memory_mb: float | None = setting(
        None,
        SIZE,
        key="max_memory",
        unset="no limit",
        help="peak host memory per rank, e.g. 4GiB; a trial over it fails with reason oom",
    )
    validate_top: int = setting(
        3,
        Whole(low=0),
        metavar="K",
        shown="from the budget: up to 3, fewer when it cannot hold them",
        help="re-measure up to K of the best configurations against the baseline, interleaved, "
        "and choose the profile from those numbers; fewer when the budget cannot hold K (the "
        "run prints its plan at the start); 0 exports the best trial as it is",
    )
    validate_rounds: int = setting(
        5,
        Whole(low=2),
        metavar="R",
        shown="from the budget: 5 aimed for, 2 to 10",
        help="interleaved rounds of that re-measurement aimed for, each measuring every "
        "candidate once; the budget makes them fewer when it is short (at least 2) and more, "
        "up to 10, when it has room",
    )
    ablate: bool = setting(
        True,
        Switch(),
        help="after re-validation, measure the winner without each knob it changes and keep "
        "only the knobs whose removal costs more than the noise",
    )
    limit: bool = setting(
        True,
        Switch(),
        help="probe the defaults right after the baseline (what bounds the step orders the "
        "screening) and the exported configuration at the end: the step's phases, the compute "
        "ceiling, the all-reduce alone and at several sizes, a trace; --no-limit skips both",
    )
    free_batch: bool = setting(
        False,
        Switch(),
        help="let the tuner change the global batch (the per-rank batch becomes a knob); "
        "training dynamics change, and the profile says so",
    )
    allow_drift: bool = setting(
        False,
        Switch(),
        help="keep configurations whose loss drifts from the fp32 baseline's beyond the drift "
        "tolerance (reduced precision, compression); otherwise they FAIL numerics_drift",
    )
    drift_tolerance: float = setting(
        DEFAULT_TOLERANCE,
        Number(low=0, high=10, what="a relative difference", hint="0.05 is 5 %"),
        help="relative drift of the first steps' loss from the fp32 baseline's above which a "
        "trial is numerics_drift",
    )
    placement: str = setting(
        "pack",
        Choice(options=PLACEMENTS),
        help="how one trial's ranks are placed on the cluster's nodes (a Ray placement-group "
        "strategy): pack as few nodes as possible, spread over as many, strict_*: fail "
        "rather than fall back",
    )
    concurrent_trials: int | None = setting(
        None,
        Whole(low=1),
        unset="as many as the cluster holds with every rank owning its share of a node's "
        "CPUs; 1 on one machine",
        help="trials measured at once, each in its own placement group",
    )
    node_wait_s: float = setting(
        NODE_WAIT_S,
        DURATION,
        key="node_wait",
        help="how long a trial whose node was lost waits for the cluster to place its ranks "
        "again before the run stops (resumable); a cluster that replaces nodes by autoscaling "
        "needs minutes",
    )

    command: tuple[str, ...] = field(default=(), compare=False)
    """Script mode: the user's command (``autotune run ... -- CMD``); empty for a trainer."""

    def __post_init__(self) -> None:
        settings.check(self)
        if self.sampler == "cmaes" and self.objective == "throughput,memory":
            raise SettingError(
                {
                    "sampler": "cmaes optimises one objective (Optuna's CMA-ES), not "
                    "throughput,memory; use tpe, gp, random or grid",
                    "objective": "throughput,memory needs a sampler of two objectives; the study "
                    "definition's cmaes (Optuna's CMA-ES) has one: give --sampler tpe, gp, "
                    "random or grid",
                }
            )

    @property
    def multi_objective(self) -> bool:
        """Throughput and peak memory: a Pareto front instead of one best."""
        return self.objective == "throughput,memory"

    @classmethod
    def load(cls, name_or_path: str) -> StudyDefinition:
        path = _find(name_or_path)
        data = _yaml.read_mapping(path, what="study definition")
        return cls.from_mapping(data, where=f"study definition {path}", name=path.stem)

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, where: str, name: str) -> StudyDefinition:
        """The definition a file's mapping gives; errors name ``where`` and the key."""
        return settings.from_mapping(cls, data, where=where, name=name, origin=where)

    def check(self, where: str = "") -> None:
        """Every setting within its rule (already so when made; kept for callers that ask).
        Errors name ``where`` and the key, else the definition's file."""
        try:
            replace(self)
        except SettingError as e:
            raise e.named(type(self), where=where or self.origin) from None

    def override(self, **changes: Any) -> StudyDefinition:
        """A copy with the command line's settings (field -> checked value; None: not given).
        Trainer options add to the definition's own unless another trainer is named. A rule
        broken names the flag, or the definition's file when the flag only met its value."""
        flags = [k for k, v in changes.items() if v is not None]
        given = {k: changes[k] for k in flags}
        if given.get("trainer", self.trainer) == self.trainer:
            given["trainer_options"] = {**self.trainer_options, **given.get("trainer_options", {})}
        else:  # the definition's options belong to its own trainer
            given.setdefault("trainer_options", {})
        try:
            return replace(self, **given)
        except SettingError as e:
            raise e.named(type(self), flags=flags, where=self.origin) from None


def available_studies() -> list[str]:
    return _yaml.builtin_names(BUILTIN_PACKAGE)


def _find(name_or_path: str) -> Path:
    return _yaml.find_builtin(
        BUILTIN_PACKAGE, name_or_path, flag="--study", kind="study definition"
    )
