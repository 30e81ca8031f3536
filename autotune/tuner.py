"""``run(request)``: one ``autotune run``, as a series of calls to the components that do the work.

1. check every input that can be checked without side effects (study definition, space,
   trainer, storage URL) - bad input leaves nothing behind;
2. connect to Ray (``cluster``), reserve one placement group per concurrent trial
   (``launcher.TrialRunner``), probe the hardware from inside the first;
3. resolve the space against backend and device (knobs that cannot act are left out, with
   the reason shown and stored on the study);
4. open or resume the study (``search.opening.open_study``): its first trial is the baseline;
5. search until the budget is spent (``search.Search`` over ``objective.Objective`` and
   ``budget.Budget``, built by ``search.assembly.assemble`` over ``launch.measurer.RayMeasurer``);
   failed trials are FAIL with a reason, the run goes on;
6. re-validate the best few against the baseline, interleaved (``validation.revalidate``);
7. ablate the winner: keep only the knobs whose removal costs more than the noise
   (``ablation.ablate``); then probe how far the defaults and the winner are from the limit
   (``limit.measure_limit``: compute ceiling, ideal-overlap bound, where the step goes);
8. export the profile (``export.export_profile``), also when Ctrl-C, SIGTERM, a lost cluster,
   a failing storage or any other error stopped the run before its budget.

Everything the run has to say goes out as events (``autotune.core.events``) to ``emit``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna

from autotune.core.compat import ray_off_main_thread_quiet
from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.errors import (
    BaselineFailed,
    ClusterLost,
    ConfigError,
    InterruptedAgain,
    Kept,
    Terminated,
    interrupted_by,
    note_terminated,
    raise_terminated,
)
from autotune.core.events import Emit, Note, ignore
from autotune.core.knobs import KNOBS
from autotune.core.target import Target
from autotune.definition.durations import format_duration
from autotune.definition.paths import check_study_name, check_writable, file_stem
from autotune.definition.space import SearchSpace
from autotune.definition.studydef import StudyDefinition
from autotune.launch.address import resolve as resolve_address
from autotune.launch.cluster import RankPlan, RayConnection, connect, plan_ranks
from autotune.launch.failures import first_line
from autotune.launch.hardware import assumed, target_of
from autotune.launch.launcher import PLACEMENT_TIMEOUT_S, TrialRunner
from autotune.launch.measurer import Measurer, RayMeasurer
from autotune.limit.probe import measure_limit
from autotune.profile.export import export_profile, study_profile
from autotune.rank.workload import Workload, load_workload
from autotune.record import storage as storage_mod
from autotune.record import trial as tr
from autotune.record.study import (
    baseline_trial,
    baseline_value,
    complete,
    counts,
    throughput,
)
from autotune.record.vet import check_studies
from autotune.report.trackers import Trackers
from autotune.script.job import ScriptJob, script_job
from autotune.script.nodes import check_files
from autotune.script.script_measurer import ScriptMeasurer
from autotune.search.assembly import Assembly, assemble
from autotune.search.budget import Budget
from autotune.search.opening import open_study
from autotune.search.screening import ruled_out

__all__ = ["RunRequest", "RunSummary", "run"]

#: How long each placement group after the first may take to be placed before the run makes
#: do with fewer concurrent trials (the first one waits PLACEMENT_TIMEOUT_S).
EXTRA_PLACEMENT_TIMEOUT_S = 10.0


@dataclass(kw_only=True)
class RunRequest:
    """One ``autotune run``: a study definition with its overrides, and where to put things."""

    definition: StudyDefinition
    run_dir: Path
    study_name: str | None = None
    storage_url: str | None = None
    address: str | None = None
    profile_path: Path | None = None
    started: float | None = None
    """``time.monotonic()`` when the command started: the budget counts from there (Ray's
    start and the placement included). None: from the first trial."""
    sigterm: bool = False
    """Stop on SIGTERM as on Ctrl-C (the CLI sets it; call ``run`` from the main thread): held
    while Ray starts and from the export on (the summary then says ``terminated``)."""
    log_to: list[str] = field(default_factory=list)  # --log-to TRACKER (report.trackers)


@dataclass
class RunSummary:
    study_name: str
    storage_url: str
    profile_path: Path | None
    trials: dict[str, int] = field(default_factory=dict)
    baseline: float | None = None
    best: float | None = None
    interrupted: bool = False
    terminated: bool = False
    """Interrupted by SIGTERM rather than Ctrl-C."""
    stopped: str | None = None
    """Why the run stopped before its budget (a lost cluster, a failed storage, ...)."""
    study: optuna.Study | None = None
    budget_s: float = 0.0
    ledger: list[tuple[str, float]] = field(default_factory=list)
    """Where the budget went (``Budget.ledger``): phases adding up to the run's time, and what
    was returned unspent."""


def run(req: RunRequest, emit: Emit | None = None) -> RunSummary:
    """Run the study ``req`` asks for; ``emit`` receives what happens (None: nothing)."""
    emit = sink = Trackers(emit or ignore, req.log_to)  # checked now, opened with the study
    # 1. Everything checkable without side effects.
    d, workload, space, storage_url = _checked(req)
    # 2. Ray and the ranks' placement groups.
    Terminated.received = False
    conn, close = _connect(req)
    if joined := conn.describe():
        emit(Note(joined))
    previous = signal.signal(signal.SIGTERM, raise_terminated) if req.sigterm else None
    # Ray's core worker may install a SIGTERM handler of its own after ray.init (seen in CI): the
    # search re-asserts this one before the baseline, between trials and while trials run.
    tick = _reassert_sigterm if req.sigterm else None
    runners: list[TrialRunner] = []
    try:
        target, runners, hw, plan = _place(d, workload)
        files = None
        if isinstance(workload, ScriptJob):  # where the nodes find the job's files
            files = check_files(runners[0], workload.command, os.getcwd())
            if not files.shared:  # Ray ships a directory for a whole job: join again with it
                for r in runners:
                    r.close()
                runners = []
                close()
                conn, close = _connect(req, working_dir=files.cwd)
                target, runners, hw, plan = _place(d, workload)
            emit(Note(files.describe(workload.nodes)))
        # 3. The space this study searches.
        resolved = space.resolve(target)
        job = workload.name if isinstance(workload, ScriptJob) else d.trainer.replace(":", ".")
        name = req.study_name or f"{d.name}-{job}-{target.backend}-{target.world_size}r"
        make_private_dir(req.run_dir)  # the logs, and the study when no --storage is given
        # 4. The study.
        study, opened = open_study(name, storage_url, d, resolved, workload.global_batch, hw)
        emit(opened)
        profile_path = req.profile_path or req.run_dir / "profiles" / f"{file_stem(name)}.yaml"
        logs = req.run_dir / "logs" / file_stem(name)
        if len(runners) > 1:
            emit(
                Note(
                    f"Measuring {len(runners)} trials at once, each in its own placement group "
                    f"({target.world_size} ranks, {plan.cpus_per_rank} CPU(s) each, "
                    f"--placement {d.placement})"
                )
            )
        measure: RayMeasurer = (
            RayMeasurer(study=study, runners=runners, definition=d, target=target)
            if files is None
            else ScriptMeasurer(
                study=study, runners=runners, definition=d, files=files, target=target
            )
        )
        run = assemble(
            study=study,
            space=resolved,
            definition=d,
            measure=measure,
            emit=emit,
            started=req.started,
            tick=tick,
            tokens_per_sample=workload.tokens_per_sample,
            logs=logs,
            trace_dir=logs / "limit",
        )
        # room for the job as it runs today, the defaults and the winner, in new processes
        run.budget.as_is_arms = 3 if measure.as_is_reason() is None else 0
        summary = RunSummary(study_name=name, storage_url=storage_url, profile_path=None)
        sink.open(study, req.run_dir, d, summary)  # the result: what the summary holds at close
        _search_and_conclude(run, summary, logs / "limit", target, emit)
        # 8. The profile, written whole: a SIGTERM from here on is held (and said afterwards).
        _hold_sigterm(req)
        _export(summary, study, profile_path, d.budget_s)
        _said_converged(run, emit)
        summary.budget_s, summary.ledger = d.budget_s, run.budget.ledger()
    finally:
        _hold_sigterm(req)
        sink.close()  # first: the trackers' runs end whatever Ray's shutdown does
        for r in runners:
            r.close()
        close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if req.sigterm and Terminated.received and not summary.interrupted:
        summary.interrupted = summary.terminated = True  # held during the export or shutdown
    return summary


def make_private_dir(path: Path) -> None:
    """The run directory (the study, the logs, the command lines): made private (0700, this
    user's alone) where this run creates it; one that exists is left as its owner set it."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # another run made it this moment
        path.mkdir(mode=0o700)
        os.chmod(path, 0o700)  # whatever the umask


def _connect(
    req: RunRequest, working_dir: str | None = None
) -> tuple[RayConnection, Callable[[], None]]:
    """Ray (started or joined) and how to close it. For the CLI on a thread of its own, SIGTERM
    and Ctrl-C held until it is up (``Kept``): ray.init's own handler exited from inside the core
    worker's constructor, leaving a core worker ray.shutdown does not know (SIGSEGV at exit)."""
    # the directory is on the ranks' path only for a trainer module of the user's, and last
    d = req.definition
    cwd = os.getcwd() if ":" in d.trainer and not d.command else None
    if not req.sigterm:
        conn = connect(req.address, trainer_dir=cwd, working_dir=working_dir)
        return conn, conn.close
    kept = Kept(lambda: _connect_quietly(req.address, cwd, working_dir), RayConnection.close, "ray")
    return kept.value, kept.close


def _connect_quietly(
    address: str | None, cwd: str | None, working_dir: str | None = None
) -> RayConnection:
    """``connect``, without Ray's warning that off the main thread it set no SIGTERM handler."""
    with ray_off_main_thread_quiet():
        return connect(address, trainer_dir=cwd, working_dir=working_dir)


def _hold_sigterm(req: RunRequest) -> None:
    if req.sigterm:
        signal.signal(signal.SIGTERM, note_terminated)


def _reassert_sigterm() -> None:
    signal.signal(signal.SIGTERM, raise_terminated)


def _checked(req: RunRequest) -> tuple[StudyDefinition, Workload | ScriptJob, SearchSpace, str]:
    """Step 1: every input checkable without side effects - the space, the workload (script
    mode: the user's command, which sets some of the definition), the output paths, the study
    name and the storage URL. Returns the definition, the workload, the space and the URL."""
    d = req.definition
    space = SearchSpace.load(d.space)
    workload: Workload | ScriptJob
    if d.command:  # script mode: the user's own command is the trial
        d, workload = script_job(d)
    elif d.global_batch is not None:
        raise ConfigError(
            "--global-batch is for script mode (autotune run ... -- CMD); a trainer takes its "
            "own: --trainer-option global_batch=N"
        )
    elif d.nodes is not None:
        raise ConfigError(
            "--nodes is for script mode (autotune run ... -- torchrun ...); a trainer's ranks "
            "go over the cluster's nodes with --placement spread"
        )
    else:
        workload = load_workload(d.trainer, d.trainer_options)
    _check_backend(space, d.backend, req.address)
    storage_url = req.storage_url or storage_mod.default_url(req.run_dir)
    check_writable(req.run_dir, flag="--run-dir", directory=True)
    if req.profile_path is not None:
        check_writable(req.profile_path, flag="--output", directory=False)
    if req.study_name is not None:
        check_study_name(req.study_name)
    if req.storage_url is not None:
        storage_mod.check_url(storage_url)
    # a study this run may resume runs what it holds: checked now, before Ray starts
    job = workload.name if isinstance(workload, ScriptJob) else d.trainer.replace(":", ".")
    check_studies(storage_url, name=req.study_name, prefix=f"{d.name}-{job}-")
    return d, workload, space, storage_url


def _check_backend(space: SearchSpace, backend: str, address: str | None) -> None:
    """Before Ray starts: refuse a space of which nothing acts on the run's backend
    (``SearchSpace.nothing_acts_on``), where that backend is known now - the one asked for, or
    for ``auto`` on this machine (no ``--address``, no ``RAY_ADDRESS``: ``address.resolve``)
    nccl where torch sees a GPU, as Ray will; on a cluster its GPUs decide ``auto`` later.
    ``--backend nccl`` on this machine without a GPU is refused now too. torch is imported only
    where the answer needs it: a space that acts on both backends needs no backend known."""
    on_cluster = resolve_address(address)[0] is not None
    problems = {b: space.nothing_acts_on(b) for b in ("gloo", "nccl")}
    if backend == "auto":
        if on_cluster or not any(problems.values()):
            return
        backend = "nccl" if _local_gpus() else "gloo"
    elif backend == "nccl" and not on_cluster and not _local_gpus():
        raise ConfigError(
            "--backend nccl: this machine has no GPU (torch sees none); use --backend gloo"
        )
    if problems[backend] is not None:
        raise problems[backend]


def _local_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _search_and_conclude(
    run: Assembly, summary: RunSummary, limit_dir: Path, target: Target, emit: Emit
) -> None:
    """Steps 5-7, in a try whose caller always exports: whatever stops the search (Ctrl-C,
    SIGTERM, a lost cluster, a locked or lost storage, a full disk, a bug), the best profile
    so far is written and the reason reported (in ``summary`` and on the study)."""
    d, search = run.definition, run.search
    try:
        # 5. Trials until the budget is spent.
        search.run()
        # 6-7. Re-measure the best few against the baseline; keep only what carries the gain.
        run.conclude()
        if d.limit and not d.command:  # script mode: the first measurement only
            # the advice never names a knob this space could not move (the hardware has no
            # bf16 units, the backend has no such hook, the user's space left it out)
            unsearched = frozenset(KNOBS) - set(run.space.distributions)
            with run.budget.phase("limit"):
                _limit(
                    run.study,
                    d,
                    run.measure,
                    limit_dir,
                    emit,
                    device=target.device,
                    unsearched=unsearched,
                    traced=run.traced,
                    budget=run.budget,
                )
    except InterruptedAgain:
        raise  # Ctrl-C twice: exit at once, nothing more exported
    except KeyboardInterrupt as e:
        _interrupted(summary, e, emit)
        search.record_stop("interrupted", f"interrupted ({interrupted_by(e)})")
    except ClusterLost as e:
        summary.stopped = str(e)
        search.record_stop("cluster_lost", str(e))
    except BaselineFailed:
        raise  # nothing was measured: there is no profile to export
    except Exception as e:  # noqa: BLE001 - reported, and the profile still exported
        cause = _cause(e)
        summary.stopped = f"{type(cause).__name__}: {first_line(str(cause))}"
        emit(Note(f"Stopped by an error: {summary.stopped}; exporting the best profile so far"))
        search.record_stop("error", summary.stopped)


def _said_converged(run: Assembly, emit: Emit) -> None:
    """When the search converged, say how much of the budget it gave back."""
    stop = run.search.stop
    if stop is not None and stop.kind == "converged":
        at = format_duration(round(stop.at_s))
        left = format_duration(round(run.budget.total_s - run.budget.elapsed_s()))
        emit(Note(f"Converged at {at}; the run ended {left} before its budget"))


def _limit(
    study: optuna.Study,
    d: StudyDefinition,
    measure: Measurer,
    trace_dir: Path,
    emit: Emit,
    device: str = "cpu",
    unsearched: frozenset[str] = frozenset(),
    traced: dict[str, Path] | None = None,
    budget: Budget | None = None,
) -> None:
    """Probe the defaults and the configuration the profile will export (when it differs);
    the advice names no knob of ``unsearched``; ``traced``: the traces the run took already
    (``Assembly.traced``). Where the run took no trace of the defaults (it re-validated
    nothing), a run of them takes it, of one window, where ``budget`` left holds it beside
    the probe; else the line says there is none."""
    base = baseline_trial(study)
    if base is None or base.state != optuna.trial.TrialState.COMPLETE:
        return
    profile = study_profile(study, budget_s=d.budget_s)
    tuned = profile.trial_config()
    configs = {"baseline": tr.config(base)}
    trials = {"baseline": base.number}
    if tuned != configs["baseline"]:
        configs["tuned"] = tuned
        trials["tuned"] = profile.study["best_trial"]
    which = " and ".join(f"{k} (trial {trials[k]})" for k in configs)
    emit(Note(f"Measuring how far from the limit: {which}"))
    # the defaults' trace, where no run of them took it: a run for it alone, one window
    rerun: MeasureSettings | None = replace(d.measure.rerun(), min_windows=1, max_windows=1)
    left = None if budget is None else budget.left_s()
    run_s = None if budget is None else budget.rerun_s()
    untraced = "baseline" not in (traced or {})
    if untraced and left is not None and run_s is not None and left < run_s * len(configs):
        rerun = None
        emit(
            Note(
                f"No Chrome trace of the defaults: no run of them took one, and the "
                f"{max(left, 0):.0f} s left hold no run for it beside the probe"
            )
        )
    measure_limit(
        study,
        measure,
        configs=configs,
        trials=trials,
        trace_dir=trace_dir,
        free_batch=d.free_batch,
        emit=emit,
        device=device,
        ruled_out=ruled_out(study) | unsearched,
        traced=traced,
        rerun=rerun,
    )


def _interrupted(summary: RunSummary, e: KeyboardInterrupt, emit: Emit) -> None:
    summary.interrupted = True
    by = interrupted_by(e)
    summary.terminated = by == "SIGTERM"
    emit(
        Note(
            f"Interrupted ({by}): the running trial is recorded; exporting the best "
            f"profile so far (Ctrl-C again to exit at once)"
        )
    )


def _cause(e: BaseException) -> BaseException:
    """The error that stopped the loop. When the storage refuses a trial's end, Optuna's
    post-processing fails an ``assert`` in a ``finally`` block (optuna 5.0, ``_optimize.py``):
    the storage's error is then that AssertionError's context, and it is the one to report;
    Optuna's ``StorageInternalError`` in turn wraps the database's own error."""
    while True:
        if isinstance(e, AssertionError) and e.__context__ is not None:
            e = e.__context__
        elif isinstance(e, optuna.exceptions.StorageInternalError) and e.__cause__ is not None:
            e = e.__cause__
        else:
            return e


def _export(summary: RunSummary, study: optuna.Study, path: Path, budget_s: float) -> None:
    """Fill ``summary`` from the study and write the profile of its best so far; a failure here
    (the storage that stopped the search may still be gone) is added to ``summary.stopped``."""
    summary.study = study
    try:
        summary.trials = counts(study)
        summary.baseline = baseline_value(study)
        if summary.trials["complete"]:
            summary.best = max(throughput(t) for t in complete(study))
            export_profile(study, path, budget_s=budget_s, note=True)
            summary.profile_path = path
    except Exception as e:  # noqa: BLE001 - the run's own reason stays the first one
        why = f"the profile could not be exported ({type(e).__name__}: {first_line(str(e))})"
        summary.stopped = f"{summary.stopped}; {why}" if summary.stopped else why


def _place(
    d: StudyDefinition, workload: Workload | ScriptJob
) -> tuple[Target, list[TrialRunner], dict[str, Any], RankPlan]:
    """Backend and world size from the cluster; the runners (placement groups); the hardware
    probed from the first; the target the space is resolved against."""
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
    try:  # the placement groups are the caller's only once this returns
        # The probe asks rank 0's process the baseline will run in: started with the defaults'
        # environment on the hardware the plan assumes (``hardware.assumed``). A script's
        # trials start their own processes, so its probe is a task of its own.
        def target(hw: dict[str, Any]) -> Target:
            return target_of(
                hw,
                backend=backend,
                world_size=world,
                global_batch=workload.global_batch,
                cpus_per_rank=plan.cpus_per_rank,
                free_batch=d.free_batch,
            )

        nodes = runners[0].nodes_spanned()
        expected = target(
            assumed(backend, world_size=world, node_count=nodes, cpus_per_rank=plan.cpus_per_rank)
        )
        env = None if isinstance(workload, ScriptJob) else TrialConfig.defaults(expected).env
        hw = runners[0].probe(env)
        if "error" in hw:
            raise ConfigError(f"--backend {backend}: {hw['error']}; use --backend gloo")
    except BaseException:
        for r in runners:
            r.close()
        raise
    return target(hw), runners, hw, plan


def _runners(d: StudyDefinition, plan: RankPlan, world: int, backend: str) -> list[TrialRunner]:
    """One TrialRunner (placement group) per concurrent trial: ``concurrent_trials`` of them,
    else as many as ``plan`` says the cluster holds. An explicit number the cluster cannot
    place is an error naming how many it holds."""
    want = d.concurrent_trials or plan.trials_fit
    runners: list[TrialRunner] = []

    def place(timeout_s: float) -> None:
        runner = TrialRunner(
            world_size=world,
            backend=backend,
            strategy=d.placement,
            cpus_per_rank=plan.cpus_per_rank,
            node_wait_s=d.node_wait_s,
            placement_timeout_s=timeout_s,
            # script mode: one bundle per node, with the ranks torchrun starts there
            ranks_per_bundle=world // (d.nodes or 1) if d.command else 1,
        )
        runners.append(runner)

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
