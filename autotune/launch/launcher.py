"""Where trials are launched: one placement group, one trial at a time, with a deadline.

``TrialRunner`` reserves one placement group with a bundle per rank for the whole run, so every
trial's ranks land where the first trial's did and no trial waits on scheduling. Its rank
processes are a warm pool (``autotune.launch.pool``). (Ray Train's TorchTrainer creates the process
group before user code runs and costs 11-16 s per trial here; plain actors avoid both.)

The runner waits for the ranks with a deadline. A rank that raises fails the trial with its
first error line (``autotune.launch.failures.classify``); a rank that hangs fails it with
``timeout``. When every error only says that a peer or a process went away, the cluster is
asked whether one of the trial's nodes died (``node_lost``). After any failure (and on
``close``) every actor of the trial is killed, so the next trial starts fresh ones.

One runner serves one thread at a time (the trial's); ``abort`` may be called from another
(Ctrl-C) to kill the running trial's ranks.

Script mode uses the group differently (``autotune.script.nodes``): one bundle per node, holding
that node's ranks (``ranks_per_bundle``), and one Ray task per bundle (``start_task``), which
starts the user's command there; the command starts its own ranks.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any, TypeVar

from autotune.core import logfile
from autotune.core.config import MeasureSettings, TrialConfig
from autotune.core.errors import (
    AutotuneError,
    ClusterLost,
    ConfigError,
    FailureReason,
    TrialFailed,
)
from autotune.core.rank_io import RankResult, RankSpec
from autotune.core.results import TrialResult
from autotune.core.stats import Interval
from autotune.definition.durations import format_duration
from autotune.definition.studydef import NODE_WAIT_S
from autotune.launch.failures import classify, gone_away, last_words
from autotune.launch.hardware import describe
from autotune.launch.pool import RankPool
from autotune.rank.env import log_path

__all__ = ["TrialRunner", "first_dead", "local_ranks", "session_key"]

T = TypeVar("T")

#: How long a placement group may take to be placed before the run gives up.
PLACEMENT_TIMEOUT_S = 60.0
#: How long the hardware probe's rank processes may take to start and answer.
PROBE_TIMEOUT_S = 120.0
#: After a rank fails, how long to wait for the others to say whether their node died.
ROOT_CAUSE_WAIT_S = 3.0
#: How long the cluster may take to report a trial's node dead once its ranks say that a peer
#: or a process went away (Ray's health checks take a few seconds to declare a node dead).
NODE_DEATH_WAIT_S = 20.0
#: What a task in the group (``call_in_group``) may take beyond its own timeout: scheduling,
#: and ending the command's processes.
TASK_GRACE_S = 30.0


def session_key(
    trainer: str, trainer_options: dict[str, Any], config: TrialConfig, seed: int
) -> str:
    """What a kept session is kept under (``RankSpec.keep``): everything it was built from."""
    built = {"trainer": trainer, "options": trainer_options, "config": asdict(config), "seed": seed}
    return hashlib.sha256(json.dumps(built, sort_keys=True, default=str).encode()).hexdigest()


def local_ranks(nodes: dict[int, str], world_size: int) -> list[tuple[int, int]]:
    """(local rank, ranks on the node) of each rank, from ``nodes`` (rank -> node id); ranks
    whose node is not known count as one node."""
    on: dict[str, list[int]] = {}
    for rank in range(world_size):
        on.setdefault(nodes.get(rank, "?"), []).append(rank)
    out = [(0, 1)] * world_size
    for ranks in on.values():
        for i, rank in enumerate(ranks):
            out[rank] = (i, len(ranks))
    return out


def first_dead(nodes: dict[int, str], wait_s: float = NODE_DEATH_WAIT_S) -> int | None:
    """The first key of ``nodes`` (rank or bundle -> node id) whose node the cluster reports
    dead within ``wait_s`` (Ray takes a few seconds to declare a node dead), else None (at
    once where ``nodes`` is empty: no node of it can be lost)."""
    import ray

    if not nodes:
        return None
    until = time.monotonic() + wait_s
    while True:
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        lost = sorted(key for key, node in nodes.items() if node not in alive)
        if lost:
            return lost[0]
        if time.monotonic() >= until:
            return None
        time.sleep(0.5)


class TrialRunner:
    """Runs trials of ``world_size`` ranks, one at a time, in one placement group.

    ``reuse=False`` starts fresh rank processes for every trial (the behaviour before the
    pool; useful to compare overheads). ``ranks_per_bundle``: ranks each bundle holds (script
    mode: one bundle per node, holding the ranks the user's command starts there).
    """

    def __init__(
        self,
        *,
        world_size: int,
        backend: str,
        cpus_per_rank: float = 1,
        strategy: str = "PACK",
        reuse: bool = True,
        placement_timeout_s: float = PLACEMENT_TIMEOUT_S,
        node_wait_s: float = NODE_WAIT_S,
        ranks_per_bundle: int = 1,
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group

        self.reuse = reuse
        self.node_wait_s = node_wait_s
        #: Set by ``abort`` (Ctrl-C or SIGTERM): the ranks that fail now were killed by it, so
        #: no failure waits to learn whether a node died.
        self.aborted = False
        self.world_size = world_size
        self.backend = backend
        self.gpus_per_rank = 1 if backend == "nccl" else 0
        self.cpus_per_rank = cpus_per_rank
        self.ranks_per_bundle = ranks_per_bundle
        k = ranks_per_bundle
        self.bundle = {"CPU": cpus_per_rank * k, **({"GPU": k} if self.gpus_per_rank else {})}
        self.bundles = world_size // k
        self.strategy = strategy.upper()
        self.pg = placement_group(
            [dict(self.bundle) for _ in range(self.bundles)], strategy=self.strategy
        )
        try:
            ray.get(self.pg.ready(), timeout=placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            have = ray.available_resources()
            ray.util.remove_placement_group(self.pg)
            free = f"free: CPU={have.get('CPU', 0):g}, GPU={have.get('GPU', 0):g}"
            if k > 1:  # script mode: one bundle per node
                raise ConfigError(
                    f"--nodes {self.bundles}: the Ray cluster cannot place {self.bundles} "
                    f"node(s) of {self.bundle} with {self.strategy.lower()} ({free}); lower "
                    "torchrun's --nnodes or --nproc-per-node, or add nodes"
                ) from None
            raise ConfigError(
                f"--world-size {world_size}: the Ray cluster cannot place {world_size} ranks of "
                f"{self.bundle} with --placement {self.strategy.lower()} ({free}); lower "
                f"--world-size or --concurrent-trials, choose another --placement, or add nodes"
            ) from None
        self.pool = RankPool(
            strategy=self._strategy,
            world_size=world_size,
            cpus_per_rank=cpus_per_rank,
            gpus_per_rank=self.gpus_per_rank,
        )
        self._probe_fn = ray.remote(describe)
        self._tasks: list[Any] = []  # the running tasks started by start_task
        #: Nodes a task found dead before the cluster said so (``ensure_placed`` waits until
        #: the group is placed elsewhere).
        self.lost_nodes: set[str] = set()

    def _strategy(self, index: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(
            placement_group=self.pg, placement_group_bundle_index=index
        )

    def abort(self) -> None:
        """Kill the running trial's ranks (or task) now (Ctrl-C from another thread): the
        trial then fails at once instead of running to its end."""
        import ray

        self.aborted = True
        self.pool.drop()
        for task in list(self._tasks):
            # a KeyboardInterrupt in the task: its ``finally`` ends the command's processes
            ray.cancel(task)

    def start_task(
        self,
        fn: Callable[..., Any],
        bundle: int,
        *,
        runtime_env: dict[str, Any] | None = None,
        per_rank: bool = False,
        **kwargs: Any,
    ) -> Any:
        """Start ``fn(**kwargs)`` as one Ray task in ``bundle``, holding the bundle's resources
        (its CPUs, and its GPUs, which Ray shows the task in ``CUDA_VISIBLE_DEVICES``), with
        ``runtime_env`` when given; its ref. ``per_rank``: one rank's share of the bundle
        instead (its CPUs, one GPU with nccl), for autotune's own ranks beside each other.
        ``abort`` cancels it until ``task_done``. Pooled rank actors are dropped first: they
        hold the bundles' CPUs."""
        import ray

        self.pool.drop()
        options: dict[str, Any] = {"runtime_env": runtime_env} if runtime_env else {}
        remote = ray.remote(fn).options(
            num_cpus=self.cpus_per_rank if per_rank else self.bundle["CPU"],
            num_gpus=self.gpus_per_rank if per_rank else self.bundle.get("GPU", 0),
            max_retries=0,
            scheduling_strategy=self._strategy(bundle),
            **options,
        )
        task = remote.remote(**kwargs)
        self._tasks.append(task)
        return task

    def end_tasks(self, tasks: list[Any], *, grace_s: float, force: bool = True) -> list[Any]:
        """End ``tasks`` (from ``start_task``): each gets ``grace_s`` to finish by itself, and
        only those still running then are cancelled. Ray's driver can abort when a cancel
        crosses the reply of a task that is just finishing ("Tried to complete task that was
        not pending"), so a finished task is never cancelled. The tasks that were cancelled."""
        import ray

        running = list(tasks)
        if running:
            _, running = ray.wait(
                running, num_returns=len(running), timeout=max(grace_s, 0), fetch_local=False
            )
        for task in running:
            ray.cancel(task, force=force)
        for task in tasks:
            self.task_done(task)
        return running

    def task_done(self, task: Any) -> None:
        """``task`` (from ``start_task``) has ended: ``abort`` no longer cancels it."""
        if task in self._tasks:
            self._tasks.remove(task)

    def bundle_nodes(self) -> dict[int, str]:
        """Bundle -> the id of the node it is placed on."""
        from ray.util import placement_group_table

        placed = placement_group_table(self.pg).get("bundles_to_node_id", {})
        return {i: placed[i] for i in range(self.bundles) if i in placed}

    def nodes_spanned(self) -> int:
        """How many nodes the ranks' bundles are placed on."""
        return len(set(self._bundle_nodes().values())) or 1

    def probe(self, env: dict[str, str] | None = None) -> dict[str, Any]:
        """The hardware seen from rank 0's bundle, plus the number of nodes the ranks span
        (``node_count``). With ``env``, the environment the first trial is expected to run
        with, it is asked of rank 0's process in rank actors started for it, which that trial
        then runs in (``pool.RankPool.describe``); without, of a task of its own."""
        import ray

        if env is not None:
            try:
                info = self.pool.describe(env, self.backend, time.monotonic() + PROBE_TIMEOUT_S)
            except TrialFailed as e:
                raise AutotuneError(
                    f"the hardware probe: rank 0's process did not answer ({e}); "
                    "`ray status` shows whether its node is alive"
                ) from None
        else:
            self.pool.drop()  # pooled actors hold the bundles' CPUs: the task would never start
            info = ray.get(
                self._probe_fn.options(
                    num_cpus=self.cpus_per_rank,
                    num_gpus=self.gpus_per_rank,
                    scheduling_strategy=self._strategy(0),
                ).remote(self.backend)
            )
        return {**info, "node_count": self.nodes_spanned()}

    def run(
        self,
        *,
        trial: int,
        trainer: str,
        trainer_options: dict[str, Any],
        config: TrialConfig,
        measure: MeasureSettings,
        seed: int,
        timeout_s: float,
        max_memory_mb: float | None = None,
        incumbent: Interval | None = None,
        log_dir: str | None = None,
        limit: dict[str, Any] | None = None,
        trace: str | None = None,
        fresh: bool = False,
        pin: bool = True,
        keep: bool = False,
    ) -> TrialResult:
        """Run one trial; raises TrialFailed with the reason when it produces no result. With
        ``log_dir``, each rank's output goes to ``log_dir/rank-N.log`` for the trial; with
        ``limit``, the ranks run the limit probe (``RankSpec.limit``) instead of windows; with
        ``trace``, rank 0 writes a Chrome trace after them (``RankSpec.trace``).
        ``fresh``: in new rank processes, whatever the pool holds; ``pin=False``: in processes
        that never pinned the allocator (``pool.RankPool``); ``keep``: on the session the ranks
        keep for this configuration, and kept for its next run (``rank.kept``: a
        re-measurement run in the pool, without a probe or trace)."""
        if keep and (fresh or limit is not None or trace is not None):
            raise ValueError("a kept session is for a re-measurement run in the pool alone")
        self.ensure_placed()
        started = time.monotonic()
        deadline = started + timeout_s
        kept_pool = False
        try:
            addr, port = self.pool.ready(config.env, deadline, fresh=fresh, pin=pin)
            nodes = self._bundle_nodes()
            spec = RankSpec(
                trial=trial,
                rank=0,  # each rank's own (and its local rank): _start_ranks
                world_size=self.world_size,
                backend=self.backend,
                master_addr=addr,
                master_port=port,
                trainer=trainer,
                trainer_options=trainer_options,
                config=config,
                measure=measure,
                seed=seed,
                timeout_s=timeout_s,
                max_memory_mb=max_memory_mb,
                incumbent=incumbent,
                log_dir=log_dir,
                limit=limit,
                trace=trace,
                keep=session_key(trainer, trainer_options, config, seed) if keep else None,
            )
            refs = self._start_ranks(spec, nodes)
            results = self._results(refs, nodes, deadline, timeout_s, log_dir)
            kept_pool = self.reuse
        finally:
            # Any failure (crash, timeout, nan, oom, node lost, Ctrl-C) kills every rank, and
            # with them their DataLoader workers: a failed trial's processes are never reused.
            if not kept_pool:
                self.pool.drop()
        results.sort(key=lambda r: r.rank)
        return TrialResult(ranks=results, wall_s=time.monotonic() - started)

    def _start_ranks(self, spec: RankSpec, nodes: dict[int, str]) -> dict[Any, int]:
        """Start ``spec`` on every pooled rank, each with its own rank and local rank (from
        ``nodes``: rank -> node id); each rank's result ref -> its rank."""
        local = local_ranks(nodes, self.world_size)
        actors = self.pool.actors
        return {
            actors[i].run.remote(
                replace(spec, rank=i, local_rank=local[i][0], local_world_size=local[i][1])
            ): i
            for i in range(self.world_size)
        }

    def _results(
        self,
        refs: dict[Any, int],
        nodes: dict[int, str],
        deadline: float,
        timeout_s: float,
        log_dir: str | None,
    ) -> list[RankResult]:
        """Every rank's result, as they come, by ``deadline``: a rank that fails fails the
        trial (``_root_cause``; a rank whose process died, with what its log in ``log_dir``
        says of why: ``_with_last_words``), one with no result by then fails it with
        ``timeout``."""
        import ray
        import ray.exceptions as rex

        results: list[RankResult] = []
        pending = list(refs)
        while pending:
            left = deadline - time.monotonic()
            done, pending = ray.wait(pending, num_returns=1, timeout=max(left, 0))
            if not done:
                stuck = sorted(refs[r] for r in pending)
                raise TrialFailed(
                    FailureReason.TIMEOUT,
                    f"no result after {timeout_s:.0f}s from rank(s) {stuck}",
                )
            try:
                results.append(ray.get(done[0]))
            except rex.RayError as e:
                first = _with_last_words(classify(refs[done[0]], e), refs[done[0]], log_dir)
                raise self._root_cause(first, pending, refs, nodes) from None
        return results

    def _root_cause(
        self,
        first: TrialFailed,
        pending: list[Any],
        refs: dict[Any, int],
        nodes: dict[int, str],
    ) -> TrialFailed:
        """When a node dies, the rank on the surviving node often fails first (its peer's
        connection closed), and the rank on the dead node is at first reported as a process
        that died. Wait for the other ranks' errors; when they only say that a peer or a
        process went away, ask the cluster whether a node of the trial (``nodes``: rank ->
        node id, taken when the trial started) other than the driver's own is gone, and
        prefer ``node_lost``."""
        import ray
        import ray.exceptions as rex

        if first.reason == FailureReason.NODE_LOST:
            return first
        symptoms = [first]
        if pending:
            done, _ = ray.wait(pending, num_returns=len(pending), timeout=ROOT_CAUSE_WAIT_S)
            for ref in done:
                try:
                    ray.get(ref)
                except rex.RayError as e:
                    other = classify(refs[ref], e)
                    if other.reason == FailureReason.NODE_LOST:
                        return other
                    symptoms.append(other)
        if self.aborted or not all(gone_away(f) for f in symptoms):
            # a rank's own error: the configuration's failure, not the cluster's; or the run
            # killed the ranks itself (the trial is recorded interrupted)
            return first
        # the driver's own node is not lost while the driver runs on it: only a trial with a
        # rank elsewhere waits for the cluster's word (a rank killed on a one-node run, by a
        # crash or the OOM killer, waited NODE_DEATH_WAIT_S for nothing)
        own = ray.get_runtime_context().get_node_id()
        lost = first_dead({r: n for r, n in nodes.items() if n != own})
        if lost is None:
            return first
        return TrialFailed(
            FailureReason.NODE_LOST,
            f"rank {lost}: its node was lost (the cluster reports node "
            f"{nodes[lost][:12]} dead; first error: {first.detail})",
        )

    def _bundle_nodes(self) -> dict[int, str]:
        """Rank -> the id of the node its bundle is placed on."""
        by_bundle = self.bundle_nodes()
        k = self.ranks_per_bundle
        return {r: by_bundle[r // k] for r in range(self.world_size) if r // k in by_bundle}

    def ensure_placed(self) -> None:
        """After a node loss Ray re-places the group's bundles; wait for that, or stop. A group
        Ray still reports placed while one of its bundles' nodes is dead (Ray notices a node's
        death seconds after a task on it failed) is waited for too: a trial started there would
        wait for ranks that cannot start."""
        import ray
        from ray.util import placement_group_table

        until = time.monotonic() + self.node_wait_s
        while True:
            table = placement_group_table(self.pg)
            if table.get("state") == "CREATED":
                alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")} - self.lost_nodes
                if set(table.get("bundles_to_node_id", {}).values()) <= alive:
                    return
            if time.monotonic() >= until:
                break
            time.sleep(0.5)
        have = ray.available_resources()
        raise ClusterLost(
            f"the Ray cluster lost capacity and cannot place {self.world_size} ranks again "
            f"within --node-wait {format_duration(self.node_wait_s)} (free now: "
            f"CPU={have.get('CPU', 0):g}, GPU={have.get('GPU', 0):g}); add nodes or lower "
            f"--world-size, then run the same command to resume"
        )

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            self.pool.drop()
            ray.util.remove_placement_group(self.pg)


def _with_last_words(failed: TrialFailed, rank: int, log_dir: str | None) -> TrialFailed:
    """``failed`` where ``rank``'s process died: with what its own log says of why in place
    of Ray's account of the death (which names none: "Worker unexpectedly exits with a
    connection error code 2 ... Some common causes include ..."), and where the whole output
    is. As it was where nothing was logged, or the log is not on this node."""
    if log_dir is None or failed.reason != FailureReason.CRASH:
        return failed
    if not failed.detail.startswith(f"rank {rank}: its process died"):
        return failed
    path = log_path(log_dir, rank)
    # a log that is missing, not a regular file or a link reads as empty (logfile.tail)
    words = last_words(logfile.tail(path, logfile.TAIL_READ).decode(errors="replace"))
    if not words:
        return failed
    return TrialFailed(
        FailureReason.CRASH, f"rank {rank}: its process died: {words} (its output: {path})"
    )
