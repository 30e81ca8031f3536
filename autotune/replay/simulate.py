"""Replay the tuner's whole loop against a recorded landscape, in simulated seconds.

A landscape (``bench/record_landscape.py``) holds, for every point of a grid over the knobs
that act on one workload, several real runs of it, window by window, with each run's seconds
outside and inside its windows. ``replay`` runs what ``autotune run`` runs - the study
record, the sampler, the designed start, the objective, the stop and prune rules, the budget,
re-validation, ablation and the export's choice, assembled by the same
``search.assembly.assemble`` - with ``ReplayMeasurer`` in place of the Ray-backed measurer
(both are ``launch.measurer.Measurer``): a trial of a point draws one of that point's recorded
runs and applies the measurement rules (``autotune.core.stats``) to its windows one by one, and
the clock advances by the seconds the run took. Nothing is started; a replay of 15 trials takes
well under a second.

The landscape's ``first_measurement`` (the defaults' probe) answers the search's first probe;
without one (or ``evidence=False``) the screening goes in the priors' listed order. Taken after
the baseline's windows, as ``autotune run`` takes it, it costs its own seconds without its
set-up and warm-up (``ReplayMeasurer.probe_alone_s``).

A re-measurement run of a point whose session is kept (``keep``: ``autotune.rank.kept``) costs
its discarded step at the point's step time and the call (``KEPT_CALL_S``) instead of its
recorded run's set-up and warm-up; its first run, and every run after one that keeps nothing,
costs the recorded seconds.

A landscape's ``failing`` values (``knob=value`` -> (reason, seconds)) fail every point with
them after that many simulated seconds, as a value that times out on real hardware does. Its
``drift`` (a fraction per simulated hour) scales every window of every point alike by ``1 +
drift x hours`` at the run's start, as a machine that slows down does: a real 2-hour run's
defaults read 436 samples/s at its start and 327-333 at 39 minutes (about -0.38 an hour). A
landscape file may name a ``base`` landscape (a path beside it) and add only ``drift`` and
``failing`` to it (``bench/landscapes/default-loopback-drifting.json``).

What it does not model: drift other than that steady one (a run is drawn at random, not in
order), runs longer than the recorded windows (they stop at the ``cap``), failures other than
``failing``'s, and the cold first baseline unless ``cold_first`` (the first run of the study is
then scaled by the recorded cold/warm ratio).

``bench/replay.py`` is the benchmark over many seeds (its table: ``autotune.replay.table``);
``tests/unit/test_replay.py`` holds its result.
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna

from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.errors import TrialFailed
from autotune.core.events import Emit, ignore
from autotune.core.rank_io import AFTER_WINDOWS, RankResult, kept_overhead_s
from autotune.core.results import TrialResult
from autotune.core.stats import Interval
from autotune.core.target import Target
from autotune.definition.space import ResolvedSpace, SearchSpace
from autotune.definition.studydef import StudyDefinition
from autotune.launch.measurer import Placement
from autotune.limit.probe import COMM_REPEATS
from autotune.profile.export import study_profile
from autotune.rank.limit_probe import PROFILED_STEPS
from autotune.search.assembly import assemble
from autotune.search.opening import open_study

__all__ = ["Landscape", "ReplayMeasurer", "ReplayResult", "replay"]

#: A point is found when its true throughput is this share of the oracle's or more.
FOUND = 0.98


def point_key(point: dict[str, Any]) -> str:
    """A grid point's key: ``name=value`` pairs, sorted by name, joined by commas."""
    return ",".join(f"{k}={point[k]}" for k in sorted(point))


@dataclass(frozen=True)
class Run:
    """One recorded run of a point."""

    windows: list[float]
    overhead_s: float
    window_s: float
    stepped_warmup: int | None = None
    """Warm-up steps of a run recorded with the step-level settle rule (the rule before a
    measurement's first windows settled it): replayed as a run now warms up, its overhead
    less the steps beyond ``min_warmup_steps``; None for a run recorded as runs are now."""


@dataclass
class Landscape:
    """Recorded runs of every point of ``grid`` (a search space of categorical dimensions)."""

    grid: dict[str, list[Any]]
    runs: dict[str, list[Run]]
    baseline_key: str
    cold_ratio: float = 1.0
    """The first baseline in fresh processes over the same defaults measured warm."""
    meta: dict[str, Any] = field(default_factory=dict)
    first: dict[str, Any] | None = None
    """The defaults' limit probe (``record_landscape``'s ``first_measurement``), if recorded."""
    failing: dict[str, tuple[str, float]] = field(default_factory=dict)
    """``knob=value`` -> (failure reason, simulated seconds): every point with it fails so."""
    drift: float = 0.0
    """The machine's throughput change per simulated hour, a fraction (every point alike)."""

    def drifted(self, at_s: float) -> float:
        """The factor on every window of a run that starts at ``at_s`` simulated seconds
        (never below a tenth: a machine does not stop)."""
        return max(0.1, 1.0 + self.drift * at_s / 3600.0)

    @classmethod
    def load(cls, path: Path | str) -> Landscape:
        raw = json.loads(Path(path).read_text())
        if "base" in raw:  # a recorded landscape, with the drift and failing values it adds
            base = cls.load(Path(path).parent / raw["base"])
            failing = {k: (str(r), float(s)) for k, (r, s) in raw.get("failing", {}).items()}
            return replace(
                base,
                drift=float(raw.get("drift", 0.0)),
                failing={**base.failing, **failing},
                meta={**base.meta, "base": raw["base"]},
            )
        stepped = raw.get("settle") != "windows"  # recorded before the windows settled warm-up
        runs = {
            k: [
                Run(
                    r["windows"],
                    r["overhead_s"],
                    r["window_s"],
                    r.get("warmup_steps") if stepped else None,
                )
                for r in rs
                if r.get("windows")  # a failed run of a point is not a measurement
            ]
            for k, rs in raw["points"].items()
        }
        runs = {k: rs for k, rs in runs.items() if rs}  # illegal points: the tuner never runs them
        cold = raw.get("cold_baseline") or {}
        ratio = 1.0
        if cold.get("fresh_after_ray_start") and cold.get("warm_pool"):
            first = statistics.median(cold["fresh_after_ray_start"][0]["windows"])
            warm = statistics.median(w for r in cold["warm_pool"] for w in r["windows"])
            ratio = first / warm
        meta = {k: v for k, v in raw.items() if k not in ("points", "grid", "first_measurement")}
        first = raw.get("first_measurement")
        return cls(
            raw["grid"],
            runs,
            raw["baseline_key"],
            ratio,
            meta,
            first if isinstance(first, dict) else None,
        )

    def value(self, key: str) -> float:
        """A point's true throughput: the median of every window of every run of it."""
        return statistics.median(w for r in self.runs[key] for w in r.windows)

    def oracle(self) -> tuple[str, float]:
        best = max(self.runs, key=self.value)
        return best, self.value(best)

    def space(self) -> SearchSpace:
        """The search space of the grid (categorical dimensions, each with its choices)."""
        from autotune.core.knobs import KNOBS

        sections: dict[str, dict[str, Any]] = {}
        for name, choices in self.grid.items():
            sections.setdefault(KNOBS[name].section, {})[name] = {
                "type": "categorical",
                "choices": list(choices),
            }
        return SearchSpace.from_mapping(
            {"description": "replayed landscape", **sections}, where="landscape", name="replay"
        )


class _Runner:
    """What the search asks of a placement group (``measure.Placement``), where there is none."""

    def ensure_placed(self) -> None:
        pass


class ReplayMeasurer:
    """A ``launch.measurer.Measurer`` over a ``Landscape``, on a simulated clock (``now``)."""

    def __init__(
        self,
        landscape: Landscape,
        study: optuna.Study,
        space: ResolvedSpace,
        definition: StudyDefinition,
        rng: random.Random,
        *,
        cold_first: bool = False,
        evidence: bool = True,
    ) -> None:
        self.landscape, self.study, self.space, self.d = landscape, study, space, definition
        self.rng = rng
        self.clock = 0.0
        self.timed_s = 0.0  # simulated seconds inside timed windows
        self.runners = [_Runner()]
        self._cold = cold_first
        self.can_probe = evidence and landscape.first is not None  # a first measurement
        self.folds_probe = self.can_probe  # taken after the baseline's windows
        self.keeps_sessions = True  # as the study's ranks do (``keep``)
        self._kept: set[str] = set()  # the grid points whose sessions are kept (``keep``)
        #: (simulated seconds at its end, grid point) of every measurement, in order.
        self.log: list[tuple[float, str]] = []
        #: Every grid point's configuration as ``TrialConfig.from_values`` makes it (the
        #: defaults for every other knob), with the point's key.
        self._points = [
            (TrialConfig.from_values(space.values_from_params(p), space.target), point_key(p))
            for p in (
                dict(zip(landscape.grid, values, strict=True))
                for values in itertools.product(*landscape.grid.values())
            )
        ]

    def now(self) -> float:
        return self.clock

    def use(self, runner: Placement) -> None:
        pass

    def abort(self) -> None:
        pass

    def config_key(self, config: TrialConfig) -> str:
        """The grid point a configuration is: the one whose configuration it equals."""
        key = next((k for c, k in self._points if c == config), None)
        if key is None:
            raise KeyError(f"not a configuration of the landscape's grid: {config}")
        return key

    def __call__(
        self,
        number: int,
        config: TrialConfig,
        incumbent: Interval | None = None,
        measure: MeasureSettings | None = None,
        log_dir: Path | None = None,
        limit: dict[str, Any] | None = None,
        trace: Path | None = None,
        keep: bool = False,
    ) -> TrialResult:
        if not keep:  # a run of its own lets the kept sessions go (``rank.kept``)
            self._kept.clear()
        if limit is not None and not limit.get(AFTER_WINDOWS):
            return self._probe()
        m = measure or self.d.measure
        key = self.config_key(config)
        for value in key.split(","):
            if value in self.landscape.failing:
                reason, wall = self.landscape.failing[value]
                self.clock += wall
                self.log.append((self.clock, key))
                raise TrialFailed(reason, f"{value} fails in this landscape")
        run = self.rng.choice(self.landscape.runs[key])
        scale = self.landscape.cold_ratio if self._cold else 1.0
        scale *= self.landscape.drifted(self.clock)
        self._cold = False
        stop_rule, prune_rule = m.stop_rule(), m.prune_rule()
        windows: list[float] = []
        stop = "cap"
        for w in run.windows[: m.max_windows]:
            windows.append(w * scale)
            if prune_rule.should_prune(windows, incumbent):
                stop = "pruned"
                break
            done, why = stop_rule.decide(windows)
            if done:
                stop = why
                break
        per_window = run.window_s / len(run.windows)
        window_s = per_window * len(windows)
        # a run recorded with the step-level settle rule warmed up longer than a run does now
        # by its steps beyond the discarded ones, each as long as a step at this point's
        # throughput (``Run.stepped_warmup``)
        step_s = config.global_batch / statistics.median(run.windows)
        fewer = 0 if run.stepped_warmup is None else max(run.stepped_warmup - m.discarded_steps, 0)
        overhead_s = max(run.overhead_s - fewer * step_s, 0.0)
        runs_on_it = 1
        if keep and key in self._kept:  # on its kept session: its discarded step and the call
            overhead_s = min(kept_overhead_s(step_s), overhead_s)
            runs_on_it = 2
        elif keep:
            self._kept.add(key)
        wall = overhead_s + window_s
        if trace is not None:  # the traced steps after the windows, at this point's step time
            wall += PROFILED_STEPS * step_s
        probed, probe_s = None, 0.0
        if limit is not None and stop != "hopeless" and self.can_probe:  # AFTER_WINDOWS
            probed, probe_s = self._probed(), self.probe_alone_s()
            wall += probe_s
        self.clock += wall
        self.timed_s += window_s
        steps = max(1, round(window_s * statistics.median(windows) / config.global_batch))
        rank = replace(
            _EMPTY,
            steps=steps,
            samples=steps * config.global_batch,
            window_s=window_s,
            windows=windows,
            steps_per_window=max(1, steps // len(windows)),
            session_runs=runs_on_it,
            stop=stop,
            setup_s=overhead_s,
            measure_s=window_s,
            limit=probed,
            probe_s=probe_s,
        )
        self.log.append((self.clock, self.config_key(config)))
        return TrialResult(ranks=[rank], wall_s=wall)

    def _probed(self) -> dict[str, Any]:
        """What the recorded first measurement's ranks measured."""
        return {k: v for k, v in (self.landscape.first or {}).items() if k in _PROBED}

    def _probe(self) -> TrialResult:
        """The recorded first measurement, on the clock for the seconds it took."""
        first = self.landscape.first or {}
        wall = float(first.get("wall_s") or 0.0)
        self.clock += wall
        rank = replace(_EMPTY, limit=self._probed())
        return TrialResult(ranks=[rank], wall_s=wall)

    def probe_alone_s(self) -> float:
        """The recorded first measurement's seconds without its set-up and warm-up: what it
        takes after a run's windows. Its ``measure_s`` where recorded; else modelled from its
        own figures: its DDP and bare steps, ``COMM_REPEATS`` rounds of the buckets and of
        the last one, and one unmeasured and ``COMM_REPEATS`` measured rounds of each fit
        size (``rank.limit_probe``). At most its ``wall_s``."""
        first = self.landscape.first or {}
        wall = float(first.get("wall_s") or 0.0)
        if first.get("measure_s") is not None:
            return min(float(first["measure_s"]), wall)
        comm = first["comm"]
        steps = first["steps"] * (first["ddp"]["step"] + first["compute"]["step"])
        rounds = COMM_REPEATS * (comm["comm_s"] + comm["last_bucket_s"])
        return min(steps + rounds + (COMM_REPEATS + 1) * sum(comm["fit_s"]), wall)


#: What a probe's record holds (the landscape's first measurement adds its own figures).
_PROBED = {
    "world_size",
    "samples_per_step",
    "accumulation_steps",
    "steps",
    "ddp",
    "compute",
    "comm",
}
_EMPTY = RankResult(
    rank=0,
    applied={},
    pid=0,
    steps=0,
    samples=0,
    window_s=0.0,
    windows=[],
    steps_per_window=0,
    warmup_steps=0,
    stop="cap",
    setup_s=0.0,
    warmup_s=0.0,
    measure_s=0.0,
    loss=0.0,
    loss_curve=[],
    peak_memory_mb=0.0,
)


@dataclass(frozen=True)
class ReplayResult:
    """What one replayed run exported, and what it cost."""

    exported: str
    """The exported configuration's grid point."""
    value: float
    """Its true throughput in the landscape."""
    share: float
    """``value`` over the oracle's."""
    trials: int
    seconds: float
    """Simulated seconds from the first trial to the exported profile."""
    timed_s: float = 0.0
    """Of them, the seconds inside timed windows (trials, re-validation, ablation)."""
    study: optuna.Study | None = field(default=None, repr=False, compare=False)
    """The replayed study (its trials, the screening summary, the re-validation)."""
    #: Simulated seconds, and search trials (the baseline included), until the search first
    #: measured a point at ``FOUND`` of the oracle or better; None when it never did.
    found_s: float | None = None
    found_trials: int | None = None
    search_s: float = 0.0  #: simulated seconds the search ran, to its stop
    stop: str | None = None  #: why it stopped (``autotune.search.stop``'s kinds)


def replay(
    landscape: Landscape,
    *,
    seed: int,
    sampler: str = "tpe",
    screening: bool = True,
    n_trials: int = 15,
    budget_s: float = 600.0,
    cold_first: bool = False,
    validate_top: int = 3,
    patience: int | None = None,
    ablation: bool = True,
    storage: optuna.storages.BaseStorage | None = None,
    emit: Emit = ignore,
    study: str = "default",
    rerun_windows: int | None = None,
    evidence: bool = True,
    early_stop: bool = True,
) -> ReplayResult:
    """One ``autotune run`` of ``study`` replayed on ``landscape``: ``n_trials`` trials (the
    baseline included) or ``budget_s`` simulated seconds, whichever ends first, then
    re-validation and the export's choice. ``storage``: resume the study ``replay`` there
    (a new in-memory one by default). ``rerun_windows``: the re-measurement runs' windows
    (``MeasureSettings.rerun_windows``) instead of the study's. ``evidence``: order the
    screening by the landscape's first measurement (False: the listed order). ``early_stop``:
    the convergence stop (``--no-early-stop`` when False)."""
    d = _definition(
        study,
        rerun_windows,
        sampler=sampler,
        seed=seed,
        n_trials=n_trials,
        budget_s=budget_s,
        validate_top=validate_top,
        screening=screening,
        patience=patience,
        ablate=ablation,
        early_stop=early_stop,
    )
    space = landscape.space().resolve(_target(landscape))
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = storage or optuna.storages.InMemoryStorage()
    st, _ = open_study("replay", "", d, space, 128, {"device": "cpu"}, storage=storage)
    rng = random.Random(seed)
    measure = ReplayMeasurer(landscape, st, space, d, rng, cold_first=cold_first, evidence=evidence)
    # the run's trace of the defaults is charged, not written (``ReplayMeasurer``)
    with tempfile.TemporaryDirectory(prefix="autotune-replay-") as traces:
        run = assemble(
            study=st,
            space=space,
            definition=d,
            measure=measure,
            emit=emit,
            clock=measure.now,
            trace_dir=Path(traces),
        )
        run.search.run()
        search_s, oracle = measure.clock, landscape.oracle()[1]
        found_trials, found_s = _found(landscape, measure.log, oracle)
        run.conclude()
    key = measure.config_key(study_profile(st).trial_config())
    value = landscape.value(key)
    return ReplayResult(
        found_s=found_s,
        found_trials=found_trials,
        search_s=search_s,
        stop=None if run.search.stop is None else run.search.stop.kind,
        exported=key,
        value=value,
        share=value / oracle,
        trials=sum(t.state.is_finished() for t in st.trials),
        seconds=measure.clock,
        timed_s=measure.timed_s,
        study=st,
    )


def _definition(study: str, rerun_windows: int | None, **changes: Any) -> StudyDefinition:
    """The study definition ``study`` with ``changes`` (``replay``'s arguments), its
    re-measurement runs of ``rerun_windows`` windows when given."""
    base = StudyDefinition.load(study)
    if rerun_windows is not None:
        base = replace(base, measure=replace(base.measure, rerun_windows=rerun_windows))
    return replace(base, **changes)


def _target(landscape: Landscape) -> Target:
    """What the landscape was recorded on, as far as resolving its space goes: two CPU ranks
    over gloo, a global batch of 128, bf16 as recorded."""
    hardware = landscape.meta.get("hardware") or {}
    return Target(
        backend="gloo",
        device="cpu",
        world_size=2,
        global_batch=128,
        cpus_per_rank=1,
        bf16=bool(hardware.get("bf16")),  # as recorded
        bf16_native=bool(hardware.get("bf16_native")),
    )


def _found(
    landscape: Landscape, log: list[tuple[float, str]], oracle: float
) -> tuple[int | None, float | None]:
    """The search's first measurement of a point at ``FOUND`` of the oracle or better: (its
    number among the measurements, the baseline's first, and its simulated seconds at its
    end); (None, None) when there was none."""
    good = ((i, at) for i, (at, key) in enumerate(log, 1) if landscape.value(key) >= FOUND * oracle)
    return next(good, (None, None))
