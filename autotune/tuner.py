"""The tuning loop: an Optuna study whose trials are real DDP jobs launched through Ray.

``run(request)`` in the order it happens:

1. check every input that can be checked without side effects (study definition, space,
   trainer, budget, storage URL) - bad input leaves nothing behind;
2. connect to Ray, reserve the ranks' placement group, probe the hardware from inside it;
3. resolve the space against backend and device (knobs that cannot act are left out, with
   the reason printed and stored on the study);
4. create or resume the study; a new study's first trial is the baseline (every knob at its
   PyTorch/NCCL/torchrun default), and every trial records its speedup against it;
5. ``study.optimize`` until the budget is spent (a trial is not started when the budget left
   is shorter than a typical trial); failed trials are FAIL with a reason, the run goes on;
6. re-validate: the few best configurations and the baseline are measured again, interleaved
   (A, B, C, A, ...), and the winner is chosen from those numbers only (``autotune.stats.choose``);
   the budget keeps room for it;
7. export the profile of the winner (or of the defaults when nothing beat them beyond the
   noise), print where the study and profile are.
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState
from rich.markup import escape

from autotune import storage as storage_mod
from autotune.config import MeasureSettings, TrialConfig
from autotune.durations import format_duration
from autotune.errors import BaselineFailed, ClusterLost, ConfigError, TrialFailed
from autotune.knobs import Target
from autotune.launcher import (
    PLACEMENT_TIMEOUT_S,
    RankPlan,
    TrialResult,
    TrialRunner,
    connect,
    plan_ranks,
)
from autotune.numerics import changes_numerics, drift
from autotune.profile import Profile
from autotune.progress import RunView, changed_settings
from autotune.samplers import make_sampler
from autotune.space import ResolvedSpace, SearchSpace
from autotune.stats import Interval, choose, interleave
from autotune.studydef import StudyDefinition
from autotune.workload import load_workload

__all__ = ["RunRequest", "RunSummary", "export_profile", "run", "study_profile"]

#: Timeout of the baseline trial when none is set (later trials derive theirs from it).
BASELINE_TIMEOUT_S = 300.0
#: Floor and multiple of the baseline's wall time for the derived trial timeout.
TIMEOUT_FLOOR_S = 30.0
TIMEOUT_FACTOR = 4.0
#: Seconds between looks at a baseline another driver is running.
BASELINE_POLL_S = 2.0
#: Study user attribute holding autotune's own record of the study.
ATTR = "autotune"
#: The objectives' names, in Optuna's order: samples/s (maximised), then with
#: ``--objective throughput,memory`` the largest peak memory of a rank (minimised).
METRICS = ["samples_per_s", "peak_memory_mb"]
#: Which driver runs a trial (user attribute ``driver``): lets a resumed run on the same host
#: close at once the trials of a driver that died (``kill -9``), without waiting for
#: Optuna's heartbeat grace period.
DRIVER = f"{socket.gethostname()}:{os.getpid()}"


@dataclass(kw_only=True)
class RunRequest:
    """One ``autotune run``: a study definition with its overrides, and where to put things."""

    definition: StudyDefinition
    run_dir: Path
    study_name: str | None = None
    storage_url: str | None = None
    address: str | None = None
    profile_path: Path | None = None


@dataclass
class RunSummary:
    study_name: str
    storage_url: str
    profile_path: Path | None
    trials: dict[str, int] = field(default_factory=dict)
    baseline: float | None = None
    best: float | None = None
    interrupted: bool = False
    stopped: str | None = None
    """Why the run stopped before its budget (the cluster lost the room for a trial)."""
    study: optuna.Study | None = None


def _print(view: RunView | None, text: str) -> None:
    if view is not None:
        view.log(text)


def run(req: RunRequest, view: RunView | None = None) -> RunSummary:
    """Run the study ``req`` asks for; ``view`` shows what happens (None: nothing)."""
    d = req.definition
    # 1. Everything checkable without side effects.
    space = SearchSpace.load(d.space)
    workload = load_workload(d.trainer, d.trainer_options)
    storage_url = req.storage_url or storage_mod.default_url(req.run_dir)
    if req.storage_url is None:
        if req.run_dir.exists() and not req.run_dir.is_dir():
            raise ConfigError(f"--run-dir {req.run_dir}: exists and is not a directory")
    else:
        storage_mod.check_url(storage_url)

    # 2. Ray and the ranks' placement group.
    conn = connect(req.address, extra_pythonpath=os.getcwd())
    runners: list[TrialRunner] = []
    try:
        import ray

        gpus = int(ray.cluster_resources().get("GPU", 0))
        backend = d.backend if d.backend != "auto" else ("nccl" if gpus else "gloo")
        if backend == "nccl" and not gpus:
            raise ConfigError("--backend nccl: the Ray cluster has no GPU; use --backend gloo")
        world = d.world_size or (gpus if backend == "nccl" else 2)
        if workload.global_batch % world:
            raise ConfigError(
                f"--world-size {world}: the workload's global batch {workload.global_batch} "
                f"is not divisible by it; pick a world size that divides it"
            )
        plan = plan_ranks(world, backend, d.placement, d.concurrent_trials)
        runners = _runners(d, plan, world, backend)
        runner = runners[0]
        hw = runner.probe()
        if "error" in hw:
            raise ConfigError(f"--backend {backend}: {hw['error']}; use --backend gloo")
        ranks_per_node = math.ceil(world / hw["node_count"])
        target = Target(
            backend=backend,
            device=hw["device"],
            world_size=world,
            global_batch=workload.global_batch,
            # the CPUs the rank's bundle reserves, never more than its machine has
            cpus_per_rank=max(1, min(plan.cpus_per_rank, hw["cpus"] // ranks_per_node)),
            bf16=hw["bf16"],
            tf32=hw["tf32"],
            free_batch=d.free_batch,
        )
        # 3. The space this study searches.
        resolved = space.resolve(target)
        name = req.study_name or f"{d.name}-{d.trainer.replace(':', '.')}-{backend}-{world}r"
        if req.storage_url is None:
            req.run_dir.mkdir(parents=True, exist_ok=True)
        # 4. The study.
        study = _open_study(name, storage_url, d, resolved, workload.global_batch, hw, view)
        profile_path = req.profile_path or req.run_dir / "profiles" / f"{name}.yaml"
        if len(runners) > 1:
            _print(
                view,
                f"Measuring {len(runners)} trials at once, each in its own placement group "
                f"({world} ranks, {plan.cpus_per_rank} CPU(s) each, --placement {d.placement})",
            )
        loop = _Loop(
            study=study,
            runners=runners,
            space=resolved,
            definition=d,
            view=view,
            tokens_per_sample=workload.tokens_per_sample,
        )
        summary = RunSummary(study_name=name, storage_url=storage_url, profile_path=None)
        # 5. Trials until the budget is spent.
        try:
            loop.optimize()
            # 6. Re-measure the best few against the baseline, interleaved.
            loop.validate()
        except KeyboardInterrupt:
            summary.interrupted = True
            _print(
                view,
                "Interrupted: the running trial is recorded; exporting the best "
                "profile so far (Ctrl-C again to exit at once)",
            )
        except ClusterLost as e:
            summary.stopped = str(e)
        # 7. The profile.
        summary.study = study
        summary.trials = _counts(study)
        summary.baseline = _baseline_value(study)
        if summary.trials["complete"]:
            summary.best = max(_throughput(t) for t in _complete(study))
            export_profile(study, profile_path, budget_s=d.budget_s, note=True)
            summary.profile_path = profile_path
        return summary
    finally:
        for r in runners:
            r.close()
        conn.close()


#: How long each placement group after the first may take to be placed before the run makes
#: do with fewer concurrent trials (the first one waits PLACEMENT_TIMEOUT_S).
EXTRA_PLACEMENT_TIMEOUT_S = 10.0


def _runners(d: StudyDefinition, plan: RankPlan, world: int, backend: str) -> list[TrialRunner]:
    """One TrialRunner (placement group) per concurrent trial: ``concurrent_trials`` of them,
    else as many as ``plan`` says the cluster holds. An explicit number the cluster cannot
    place is an error naming how many it holds."""
    want = d.concurrent_trials or plan.trials_fit
    runners: list[TrialRunner] = []

    def place(timeout_s: float) -> None:
        runners.append(
            TrialRunner(
                world_size=world,
                backend=backend,
                cpus_per_rank=plan.cpus_per_rank,
                strategy=d.placement,
                placement_timeout_s=timeout_s,
            )  # fmt: skip
        )

    try:
        place(PLACEMENT_TIMEOUT_S)
        while len(runners) < want:
            try:
                place(EXTRA_PLACEMENT_TIMEOUT_S)
            except ConfigError:
                if d.concurrent_trials is None:
                    break  # the estimate was optimistic: make do with what was placed
                raise ConfigError(
                    f"--concurrent-trials {want}: the Ray cluster holds {len(runners)} trial(s) "
                    f"of {world} ranks with {plan.cpus_per_rank} CPU(s) each at once; lower it "
                    f"or add nodes"
                ) from None
    except BaseException:
        for r in runners:
            r.close()
        raise
    return runners


def _open_study(
    name: str,
    url: str,
    d: StudyDefinition,
    space: ResolvedSpace,
    global_batch: int,
    hw: dict[str, Any],
    view: RunView | None,
) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = storage_mod.open_storage(url)
    sampler = make_sampler(d.sampler, d.seed, space.grid() if d.sampler == "grid" else None)
    workload = {
        "trainer": d.trainer,
        "options": dict(d.trainer_options),
        "world_size": space.target.world_size,
        "backend": space.target.backend,
        "global_batch": global_batch,
    }
    if d.free_batch:  # another study: its trials measure other global batches
        workload["free_batch"] = True
    directions = [optuna.study.StudyDirection.MAXIMIZE]
    if d.multi_objective:  # and the least peak memory per rank
        directions.append(optuna.study.StudyDirection.MINIMIZE)
    existing = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    created = False
    if name not in existing:
        try:
            study = optuna.create_study(
                study_name=name, storage=storage, sampler=sampler, directions=directions
            )
            created = True
        except optuna.exceptions.DuplicatedStudyError:
            pass  # another driver on the same storage created it a moment ago: join it
    if created:
        # at once: a driver joining this new study a moment later finds the baseline queued
        study.enqueue_trial(space.baseline_params(), user_attrs={"baseline": True})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(METRICS[: len(directions)])
        _print(view, f"New study [bold]{escape(name)}[/]")
    else:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
        if study.directions != directions:
            raise ConfigError(
                f"--study-name {name}: that study in {url} was not made for --objective "
                f"{d.objective}; choose another --study-name"
            )
        old = study.user_attrs.get(ATTR, {}).get("workload")
        if old is not None and old != workload:
            raise ConfigError(
                f"--study-name {name}: that study measured workload {old}, this run asks for "
                f"{workload}; choose another --study-name"
            )
        _print(view, f"Resuming study [bold]{escape(name)}[/] ({len(study.trials)} trials so far)")
    record = dict(study.user_attrs.get(ATTR, {}))
    record.update(
        version=1,
        workload=workload,
        hardware={
            k: hw.get(k)
            for k in ("device", "device_name", "device_count", "node_count", "torch", "nccl")
        },
        space=space.to_mapping(),
        left_out=[str(x) for x in space.dropped],
    )
    study.set_user_attr(ATTR, record)
    _print(
        view,
        f"Searching {len(space.distributions)} dimensions: {', '.join(space.distributions)}",
    )
    if space.dropped:
        _print(view, "Left out on this backend/device (no trial is spent on a no-op):")
        for item in space.dropped:
            _print(view, f"  - {escape(str(item))}")
    closed = _close_abandoned_trials(study)
    if closed:
        _print(
            view,
            f"Closed {len(closed)} trial(s) left RUNNING by a driver that died: "
            f"{', '.join(map(str, closed))} (FAIL, reason interrupted)",
        )
    if _baseline_value(study) is None and not any(
        t.state in (TrialState.WAITING, TrialState.RUNNING) for t in _baselines(study)
    ):
        study.enqueue_trial(space.baseline_params(), user_attrs={"baseline": True})
    return study


def _driver_alive(driver: str) -> bool | None:
    """Whether the autotune driver ``host:pid`` still runs; None when it ran on another host."""
    host, _, pid = driver.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"autotune" in f.read()
    except OSError:
        return False


def _close_abandoned_trials(study: optuna.Study) -> list[int]:
    """FAIL (reason ``interrupted``) the RUNNING trials whose driver died on this host.

    Trials of drivers on other hosts are left to Optuna's heartbeat, which fails them once
    they have been silent for the grace period.
    """
    closed = []
    storage = study._storage
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        driver = t.user_attrs.get("driver", "")
        if _driver_alive(driver) is False:
            storage.set_trial_user_attr(t._trial_id, "reason", "interrupted")
            storage.set_trial_user_attr(
                t._trial_id, "reason_detail", f"its driver ({driver}) stopped during the trial"
            )
            storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            closed.append(t.number)
    return closed


def _baseline_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    for t in _complete(study):
        if t.user_attrs.get("baseline"):
            return t
    return None


def _baselines(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Every baseline trial of the study, in any state."""
    return [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("baseline")]


def _baseline_value(study: optuna.Study) -> float | None:
    t = _baseline_trial(study)
    return None if t is None else _throughput(t)


def _throughput(t: optuna.trial.FrozenTrial) -> float:
    """A COMPLETE trial's samples/s (its first objective, whatever the study's objectives)."""
    return t.values[0]


def _counts(study: optuna.Study) -> dict[str, int]:
    out = {"complete": 0, "failed": 0, "pruned": 0}
    key = {TrialState.COMPLETE: "complete", TrialState.FAIL: "failed", TrialState.PRUNED: "pruned"}
    for t in study.get_trials(deepcopy=False):
        if t.state in key:
            out[key[t.state]] += 1
    out["total"] = sum(out.values())
    return out


class _Loop:
    """The objective and the budget guard of one run."""

    def __init__(
        self,
        *,
        study: optuna.Study,
        runners: list[TrialRunner],
        space: ResolvedSpace,
        definition: StudyDefinition,
        view: RunView | None,
        tokens_per_sample: int | None = None,
    ) -> None:
        self.study, self.space, self.d = study, space, definition
        # One runner per concurrent trial; the first also probes and re-validates (one set of
        # nodes for every re-measurement: the comparison is not mixed with node differences).
        self.runners = runners
        self._local = threading.local()  # the runner of the trial this thread runs
        self._stop = threading.Event()
        self.interrupted = False
        self.tokens_per_sample = tokens_per_sample  # language models: tokens/s recorded too
        self.view = view
        self.started = time.monotonic()
        self.walls: list[float] = []
        # What a re-validation run of each measured trial would take (its overhead and
        # min_windows of its windows): re-validation runs are that short (see validate()).
        self.rerun_walls: list[float] = []
        self.plan: tuple[int, int] | None = None  # (candidates, rounds) to re-validate

    @property
    def runner(self) -> TrialRunner:
        """The runner of the trial running in this thread (the first one outside trials)."""
        return getattr(self._local, "runner", self.runners[0])

    def left_s(self) -> float:
        return self.d.budget_s - (time.monotonic() - self.started)

    def optimize(self) -> None:
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        self.started = time.monotonic()
        if self.view is not None:
            self.view.budget_started()
        if not self._baseline_first():
            return
        if len(self.runners) == 1:
            self.study.optimize(
                self.objective,
                timeout=max(self.left_s(), 0.0),
                catch=(TrialFailed,),
                callbacks=[self.between_trials],
            )
        else:
            self._optimize_concurrently()

    def _one_trial(self) -> None:
        self.study.optimize(
            self.objective, n_trials=1, catch=(TrialFailed,), callbacks=[self.between_trials]
        )

    def _baseline_first(self) -> bool:
        """Measure the baseline before any other trial: every speedup, the trial timeout and
        the pruning bar come from it. Where several drivers share the study, the one that
        takes the enqueued baseline runs it and the others wait for it. False when the budget
        ran out first."""
        said = False
        while _baseline_trial(self.study) is None:
            if self.left_s() <= 0:
                return False
            states = [t.state for t in _baselines(self.study)]
            if TrialState.WAITING in states:
                self._one_trial()  # Optuna takes the enqueued (WAITING) trial first
            elif TrialState.RUNNING in states:
                if not said:
                    _print(self.view, "Waiting for the baseline, run by another driver")
                    said = True
                # a driver that died (kill -9) leaves it RUNNING: Optuna's heartbeat fails it
                optuna.storages.fail_stale_trials(self.study)
                time.sleep(BASELINE_POLL_S)
            else:  # another driver's baseline failed, or was never enqueued: run one here
                self.study.enqueue_trial(
                    self.space.baseline_params(), user_attrs={"baseline": True}
                )
        return True

    def _optimize_concurrently(self) -> None:
        """One thread per runner, each running one trial after another until the budget or a
        stop; Optuna's storage hands each its trial, and TPE's constant liar sees the trials
        in flight. Ctrl-C kills every running trial's ranks and records them ``interrupted``."""
        errors: list[BaseException] = []

        def work(runner: TrialRunner) -> None:
            self._local.runner = runner
            try:
                while not self._stop.is_set() and self._room_for_another():
                    runner.ensure_placed()
                    self._one_trial()
            except BaseException as e:  # ClusterLost, BaselineFailed, a bug: stop them all
                errors.append(e)
                self._stop.set()

        threads = [
            threading.Thread(target=work, args=(r,), name=f"trial-runner-{i}", daemon=True)
            for i, r in enumerate(self.runners)
        ]
        for t in threads:
            t.start()
        try:
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(timeout=0.5)
        except KeyboardInterrupt:
            self.interrupted = True
            self._stop.set()
            for r in self.runners:
                r.abort()
            for t in threads:
                t.join(timeout=30)
            raise
        if errors:
            raise errors[0]

    def trial_timeout(self) -> float:
        if self.d.trial_timeout_s is not None:
            return self.d.trial_timeout_s
        base = _baseline_trial(self.study)
        if base is None or "wall_s" not in base.user_attrs:
            return BASELINE_TIMEOUT_S
        return max(TIMEOUT_FLOOR_S, TIMEOUT_FACTOR * base.user_attrs["wall_s"])

    def _measure(
        self,
        number: int,
        config: TrialConfig,
        incumbent: Interval | None = None,
        measure: MeasureSettings | None = None,
    ) -> TrialResult:
        """One real run of ``config`` with this study's workload and measurement settings."""
        return self.runner.run(
            trial=number,
            trainer=self.d.trainer,
            trainer_options=dict(self.d.trainer_options),
            config=config,
            measure=measure or self.d.measure,
            seed=self.d.seed or 0,
            timeout_s=self.trial_timeout(),
            max_memory_mb=self.d.max_memory_mb,
            incumbent=incumbent,
        )

    def between_trials(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """Stop before a trial that the budget left cannot hold; raise ClusterLost before one
        the cluster has no room for (so no trial is asked for in vain)."""
        if not self._room_for_another():
            study.stop()
            return
        self.runner.ensure_placed()

    def _room_for_another(self) -> bool:
        """Whether the budget left holds a typical trial and, once there is something to
        re-validate, the re-validation."""
        left = self.left_s()
        if left <= 0:
            return False
        if self.walls:
            wall = statistics.median(self.walls)
            run = statistics.median(self.rerun_walls) if self.rerun_walls else wall
            self.plan = _validation_plan(self.d, self.d.budget_s, run)
            # Room for the re-validation once there is something to re-validate.
            base = _baseline_value(self.study)
            above = base is not None and any(_throughput(t) > base for t in _complete(self.study))
            runs = 0 if self.plan is None or not above else (self.plan[0] + 1) * self.plan[1]
            if left < wall + run * runs:
                return False
        return True

    def objective(self, trial: optuna.Trial) -> float | tuple[float, float]:
        t0 = time.monotonic()
        trial.set_user_attr("driver", DRIVER)
        values = self.space.suggest(trial)
        config = TrialConfig.from_values(values, self.space.target)
        trial.set_user_attr("config", config.to_dict())
        is_baseline = bool(trial.user_attrs.get("baseline"))
        baseline = _baseline_value(self.study)
        if self.view is not None:
            self.view.trial_started(_tag(trial), self._changed(trial.params))
        try:
            illegal = self.space.illegal(values)
            if illegal:
                raise TrialFailed("illegal", illegal)
            # Pruning compares throughput only: it would cut memory-lean configurations short
            # in a multi-objective study, and Optuna has no pruning there.
            prune = not (is_baseline or self.d.multi_objective)
            result = self._measure(trial.number, config, _incumbent(self.study) if prune else None)
        except KeyboardInterrupt:
            # Optuna records the trial FAIL and re-raises; the runner has killed its ranks.
            trial.set_user_attr("reason", "interrupted")
            trial.set_user_attr("reason_detail", "Ctrl-C during the trial")
            raise
        except ClusterLost as e:
            trial.set_user_attr("reason", "cluster_lost")
            trial.set_user_attr("reason_detail", str(e))
            raise
        except TrialFailed as e:
            failure = e
            if self.interrupted:  # its ranks were killed by Ctrl-C in another thread
                failure = TrialFailed("interrupted", "Ctrl-C during the trial")
            trial.set_user_attr("wall_s", round(time.monotonic() - t0, 3))
            self.walls.append(time.monotonic() - t0)
            self._failed(trial, failure)
            if is_baseline:
                raise BaselineFailed(
                    f"the baseline trial (PyTorch defaults) failed: {failure}; the workload "
                    f"must run with the defaults before it can be tuned"
                ) from None
            raise failure from None
        ranks = result.ranks
        # None: another driver's baseline is not measured yet (a shared study's first minutes)
        speedup = 1.0 if is_baseline else result.throughput / baseline if baseline else None
        attrs = {
            "throughput": round(result.throughput, 3),
            "interval": result.interval.to_dict(),
            "windows": [round(w, 2) for w in result.windows],
            "stop": ranks[0]["stop"],
            "warmup_steps": ranks[0]["warmup_steps"],
            "step_time_s": round(result.step_time_s, 6),
            "peak_memory_mb": [r["peak_memory_mb"] for r in ranks],
            "speedup": None if speedup is None else round(speedup, 4),  # None: dropped below
            "steps": ranks[0]["steps"],
            "window_s": round(result.window_s, 3),
            "wall_s": round(result.wall_s, 3),
            "overhead_s": round(result.overhead_s, 3),
            # where the overhead went, on the slowest rank: warm-up steps, and the rest before
            # them (process group, model, DDP, DataLoader; process start when fresh)
            "warmup_s": round(max(r["warmup_s"] for r in ranks), 3),
            "init_s": round(max(r["setup_s"] - r["warmup_s"] for r in ranks), 3),
            "loss": ranks[0]["loss"],
            "nodes": [r.get("node_ip") for r in ranks],  # where each rank ran, in rank order
        }
        if speedup is None:
            del attrs["speedup"]
        if self.tokens_per_sample:
            attrs["tokens_per_s"] = round(result.throughput * self.tokens_per_sample, 1)
        attrs["loss_curve"] = [float(f"{x:.6g}") for x in ranks[0].get("loss_curve", [])]
        drifted = None if is_baseline else self._drift(config, attrs)
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        if not self.d.multi_objective:  # Optuna takes no intermediate values there
            for i, w in enumerate(result.windows):
                trial.report(w, i)  # the dashboard's intermediate values: one per window
        self.walls.append(time.monotonic() - t0)
        per_window = result.window_s / len(result.windows)
        self.rerun_walls.append(result.overhead_s + self.d.measure.min_windows * per_window)
        if drifted is not None:  # over pruning too: the more telling verdict
            self._failed(trial, drifted)
            raise drifted
        self._report(trial, result, speedup, params=trial.params)
        if result.pruned:
            raise optuna.TrialPruned(
                f"upper bound {result.interval.high:.1f} below the incumbent's interval"
            )
        if self.d.multi_objective:
            return result.throughput, max(r["peak_memory_mb"] for r in ranks)
        return result.throughput

    def _failed(self, trial: optuna.Trial, failure: TrialFailed) -> None:
        """Record why ``trial`` fails (attributes ``reason``, ``reason_detail``) and show it."""
        trial.set_user_attr("reason", failure.reason)
        trial.set_user_attr("reason_detail", failure.detail)
        self._report(trial, None, None, params=trial.params, failure=failure)

    def _drift(self, config: TrialConfig, attrs: dict[str, Any]) -> TrialFailed | None:
        """The numerics guard (``autotune.numerics``): record the drift of a configuration that
        changes numerics in ``attrs``; the failure to record when it is over the tolerance and
        the study does not allow drift."""
        changed = changes_numerics(config)
        base = _baseline_trial(self.study)
        base_curve = None if base is None else base.user_attrs.get("loss_curve")
        if base is not None and base.user_attrs["config"]["global_batch"] != config.global_batch:
            base_curve = None  # --free-batch: other samples per step, no like-for-like curve
        found = drift(attrs["loss_curve"], base_curve) if changed and base_curve else None
        if found is None:
            return None
        value, steps = found
        attrs["numerics_drift"] = round(value, 5) if math.isfinite(value) else "inf"
        tol = self.d.drift_tolerance
        if value <= tol or self.d.allow_drift:
            return None
        return TrialFailed(
            "numerics_drift",
            f"{' '.join(changed)}: the loss of the first {steps} steps differs from the fp32 "
            f"baseline's by {value:.1%} (tolerance {tol:.0%}); --allow-drift keeps such settings",
        )

    def validate(self) -> dict[str, Any] | None:
        """Measure the best few configurations and the baseline again, interleaved, and store
        the choice made from those numbers on the study (user attribute ``validation``)."""
        base = _baseline_trial(self.study)
        if self.plan is None or base is None:
            return None
        top, rounds = self.plan
        candidates: dict[str, optuna.trial.FrozenTrial] = {}
        seen = set()
        for t in sorted(_complete(self.study), key=lambda t: -_throughput(t)):
            key = tuple(sorted(t.params.items()))
            if t.number == base.number or key in seen or _throughput(t) <= _throughput(base):
                continue
            seen.add(key)
            candidates[f"trial {t.number}"] = t
            if len(candidates) == top:
                break
        if not candidates:
            _print(self.view, "No trial measured above the baseline: nothing to re-validate")
            return None
        keys = ["baseline", *candidates]
        order = interleave(keys, rounds)
        # Each run measures min_windows windows: the comparison's noise is between runs (the
        # machine drifts), not between the windows of one run, so short runs in more rounds
        # say more than long runs in few.
        m = self.d.measure
        rerun = replace(m, max_windows=m.min_windows)
        _print(
            self.view,
            f"Re-validating {', '.join(candidates)} against the baseline: "
            f"{rounds} interleaved rounds ({len(order)} runs)",
        )
        runs: dict[str, list[float]] = {k: [] for k in keys}
        failed: dict[str, str] = {}
        timed_s = 0.0  # seconds inside timed windows, for the budget's efficiency
        trials = {"baseline": base, **candidates}
        for key in order:
            if key in failed:
                continue
            if self.view is not None:
                self.view.trial_started(f"re-validating {key}", self._changed(trials[key].params))
            try:
                config = TrialConfig.from_dict(trials[key].user_attrs["config"])
                result = self._measure(trials[key].number, config, measure=rerun)
            except TrialFailed as e:
                failed[key] = f"{e.reason}: {e.detail}"
                _print(self.view, f"  {key:>10} [red]FAIL[/] {escape(failed[key])}")
                if key == "baseline":
                    _print(self.view, "The baseline failed: re-validation abandoned")
                    return None
                runs.pop(key)
                continue
            runs[key].append(result.throughput)
            timed_s += result.window_s
            ci = result.interval
            _print(
                self.view,
                f"  {key:>10} {ci.median:9.1f} samples/s ±{100 * ci.rel_half_width:.1f}%",
            )
        if self.view is not None:
            self.view.running.clear()
        if len(runs) < 2:
            return None
        v = choose(runs, "baseline")
        record = {
            **v.to_dict(),
            "trials": {k: trials[k].number for k in runs},
            "order": order,
            "measurements": {k: [round(x, 2) for x in xs] for k, xs in runs.items()},
            "failed": failed,
            "timed_s": round(timed_s, 3),
            "after_trial": max(t.number for t in self.study.get_trials(deepcopy=False)),
        }
        self.study.set_user_attr("validation", record)
        sp = v.speedup
        if v.beats_baseline:
            _print(
                self.view,
                f"Validated: {v.winner} is {sp.median:.2f}x the defaults "
                f"(95% interval {sp.low:.2f}-{sp.high:.2f}x)",
            )
        else:
            _print(self.view, f"Validated: {escape(v.reason)}")
        return record

    def _report(
        self,
        trial: optuna.Trial,
        result: Any,
        speedup: float | None,
        *,
        params: dict[str, Any],
        failure: TrialFailed | None = None,
    ) -> None:
        tag = _tag(trial)
        shown = self._changed(params)
        pruned = result is not None and result.pruned
        if self.view is not None:
            state = "failed" if failure is not None else "pruned" if pruned else "complete"
            self.view.trial_finished(state, speedup, trial.number, tag)
        elapsed = format_duration(time.monotonic() - self.started)
        if failure is not None:
            _print(
                self.view,
                f"[{elapsed}] {tag:>9} [red]FAIL[/] {failure.reason}: "
                f"{escape(failure.detail)}  [dim]{escape(shown)}[/]",
            )
            return
        ci = result.interval
        pm = 100 * ci.rel_half_width
        how = ("[yellow]PRUNED[/] " if pruned else "") + f"±{pm:.1f}% {len(result.windows)}w"
        _print(
            self.view,
            f"[{elapsed}] {tag:>9} [green]{ci.median:9.1f}[/] samples/s "
            f"{'  -  ' if speedup is None else f'{speedup:5.2f}'}x {how}  [dim]{escape(shown)}[/]",
        )

    def _changed(self, params: dict[str, Any]) -> str:
        """The settings of ``params`` that differ from the defaults, as ``k=v`` words."""
        return changed_settings(params, self.space.defaults())


#: Most interleaved rounds the re-validation grows to when the budget has room for them.
MAX_ROUNDS = 10


def _validation_plan(
    d: StudyDefinition, budget_s: float, run_wall_s: float
) -> tuple[int, int] | None:
    """(candidates, rounds) of the re-validation that fit in a third of the budget, given the
    typical re-validation run's wall time. ``validate_rounds`` is the number of rounds aimed
    for; when they do not fit, fewer candidates first, then fewer rounds (the interval's width
    goes with t(n-1)/sqrt(n): 9.0 at 2 rounds, 2.5 at 3, 1.2 at 5 - rounds are worth more than
    candidates); when there is room left, more rounds, up to ``MAX_ROUNDS``. None when even one
    candidate over two rounds does not fit in half of the budget."""
    top, rounds = d.validate_top, d.validate_rounds
    if top == 0 or d.multi_objective:  # the profile is chosen from the Pareto front instead
        return None
    room = budget_s / 3
    while (top + 1) * rounds * run_wall_s > room and (rounds > 2 or top > 1):
        if top > 1:
            top -= 1
        else:
            rounds -= 1
    if (top + 1) * rounds * run_wall_s > budget_s / 2:
        return None
    while rounds < MAX_ROUNDS and (top + 1) * (rounds + 1) * run_wall_s <= room:
        rounds += 1
    return top, rounds


#: How the profile of a throughput-and-memory study is chosen from its Pareto front.
PARETO_RULE = (
    "the fastest configuration on the Pareto front that needs no more peak memory per rank "
    "than the defaults (the fastest on the front when every one needs more)"
)


def _pareto_choice(
    front: list[optuna.trial.FrozenTrial], base: optuna.trial.FrozenTrial | None
) -> optuna.trial.FrozenTrial:
    """``PARETO_RULE``: applying the profile then never costs memory when it can be helped."""
    limit = None if base is None else base.values[1]
    lean = [t for t in front if limit is None or t.values[1] <= limit]
    return max(lean or front, key=_throughput)


def _complete(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))


def _incumbent(study: optuna.Study) -> Interval | None:
    """The best COMPLETE trial's throughput interval: a trial clearly below it is pruned."""
    complete = _complete(study)
    if not complete:
        return None
    best = max(complete, key=_throughput)
    if "interval" not in best.user_attrs:
        return None  # measured by an autotune without intervals
    return Interval.from_dict(best.user_attrs["interval"])


def _tag(trial: optuna.Trial) -> str:
    return "baseline" if trial.user_attrs.get("baseline") else f"trial {trial.number}"


def failure_reasons(study: optuna.Study) -> Counter[str]:
    """How many FAIL trials ended with each reason."""
    return Counter(
        t.user_attrs.get("reason", "unknown")
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
    )


def export_profile(
    study: optuna.Study,
    path: Path,
    *,
    budget_s: float | None = None,
    note: bool = False,
    trial: int | None = None,
) -> Path:
    """Write ``study``'s profile (``study_profile``) to ``path``; with ``note``, also put it
    in the study's optuna-dashboard note."""
    profile = study_profile(study, budget_s=budget_s, trial=trial)
    saved = profile.save(path)
    if note:
        from optuna_dashboard import save_note

        text = profile.to_yaml()
        save_note(study, f"## Exported profile\n\n`{saved}`\n\n```yaml\n{text}```\n")
    return saved


def study_profile(
    study: optuna.Study, *, budget_s: float | None = None, trial: int | None = None
) -> Profile:
    """The profile of ``study``: the re-validation's winner when there is one, else the best
    COMPLETE trial (with ``--objective throughput,memory``: chosen from the Pareto front, see
    ``_pareto_choice``), or trial number ``trial``; with the evidence in ``measured``."""
    record = study.user_attrs.get(ATTR)
    if not record:
        raise ConfigError(f"--study-name {study.study_name}: not an autotune study")
    complete = _complete(study)
    if not complete:
        raise ConfigError(
            f"--study-name {study.study_name}: no COMPLETE trial to export yet; run it first"
        )
    base = _baseline_trial(study)
    multi = len(study.directions) > 1
    front = sorted(study.best_trials, key=_throughput) if multi else []
    best = _pareto_choice(front, base) if multi else max(complete, key=_throughput)
    if trial is not None:
        best = next((t for t in complete if t.number == trial), None)
        if best is None:
            raise ConfigError(
                f"--trial {trial}: not a COMPLETE trial of {study.study_name}; pick one of "
                f"{', '.join(str(t.number) for t in complete)}"
            )
    baseline = _throughput(base) if base is not None else None
    counts = _counts(study)
    measured: dict[str, Any] = {
        "baseline_samples_per_s": None if baseline is None else round(baseline, 2),
        "best_samples_per_s": round(_throughput(best), 2),
        "speedup": None if not baseline else round(_throughput(best) / baseline, 3),
        "interval": best.user_attrs.get("interval"),
        "trials": counts,
        "budget": None if budget_s is None else format_duration(budget_s),
        "tuning_s": round(sum(t.user_attrs.get("wall_s", 0.0) for t in study.trials), 1),
    }
    if multi:
        measured["baseline_peak_memory_mb"] = None if base is None else base.values[1]
        measured["pareto"] = [
            {
                "trial": t.number,
                "samples_per_s": round(t.values[0], 2),
                "peak_memory_mb": t.values[1],
                "speedup": None if not baseline else round(t.values[0] / baseline, 3),
            }
            for t in front
        ]
    validation = None if trial is not None or multi else study.user_attrs.get("validation")
    if trial is not None:
        measured["validation"] = None
        measured["note"] = f"trial {trial}, chosen by hand (autotune export --trial)"
    elif multi:
        measured["validation"] = None
        measured["note"] = (
            f"--objective throughput,memory: {PARETO_RULE} ({len(front)} on the front, listed "
            f"in pareto; `autotune export --trial N` writes another); not re-validated"
        )
    elif validation and base is not None:
        # The choice made from the interleaved re-measurements, not the search's best value
        # (which is biased upwards: it is the maximum of many noisy measurements).
        winner = validation["winner"]
        number = validation["trials"][winner]
        best = study.trials[number]
        results = validation["results"]
        speedup = results[winner]["speedup"]
        measured.update(
            best_samples_per_s=results[winner]["throughput"]["median"],
            baseline_samples_per_s=results["baseline"]["throughput"]["median"],
            speedup=round(speedup["median"], 3),
            speedup_interval=[speedup["low"], speedup["high"]],
            interval=results[winner]["throughput"],
            validation={
                "rounds": len(validation["measurements"]["baseline"]),
                "order": validation["order"],
                "results": {
                    k: {
                        "trial": validation["trials"][k],
                        "samples_per_s": validation["measurements"][k],
                        "speedup": [r["speedup"]["low"], r["speedup"]["median"],
                                    r["speedup"]["high"]],
                        "beats_baseline": r["beats_baseline"],
                    }
                    for k, r in results.items()
                },
                "failed": validation.get("failed", {}),
                "after_trial": validation["after_trial"],
            },
        )  # fmt: skip
        if not validation["beats_baseline"]:
            measured["note"] = validation["reason"]
    else:
        measured["validation"] = None
        if base is not None and best.number == base.number:
            measured["note"] = "no trial beat the baseline: keep PyTorch's defaults"
        else:
            measured["note"] = (
                "not re-validated: the speedup is the search's best single trial, biased "
                "upwards; run with --validate-top 3 for an interval"
            )
    declared = record["workload"]["global_batch"]
    if best.user_attrs["config"]["global_batch"] != declared:
        measured["batch_changed"] = (
            f"global batch {best.user_attrs['config']['global_batch']} instead of the "
            f"workload's {declared} (--free-batch): training dynamics change; a learning rate, "
            f"warm-up or schedule tuned for {declared} may need tuning again"
        )
    if "numerics_drift" in best.user_attrs:  # only a study that allows drift exports it
        measured["numerics_drift"] = best.user_attrs["numerics_drift"]
    return Profile.from_config(
        TrialConfig.from_dict(best.user_attrs["config"]),
        study={
            "name": study.study_name,
            "best_trial": best.number,
            "baseline_trial": None if base is None else base.number,
        },
        workload=record["workload"],
        hardware=record["hardware"],
        measured=measured,
    )
