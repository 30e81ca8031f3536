"""Where trials are launched: Ray, a placement group, and one actor process per DDP rank.

* ``connect(address)`` starts a local Ray instance (``address=None``) or joins an existing
  cluster (``auto`` or ``HOST:PORT``).
* ``TrialRunner`` reserves one placement group with a bundle per rank for the whole run, so
  every trial's ranks land where the first trial's did and no trial waits on scheduling.
* The rank actors are a warm pool: a trial whose environment (``config.env``: ``NCCL_*``,
  ``OMP_NUM_THREADS``) equals the previous trial's runs in the previous trial's processes, which
  saves process start, imports and first-use costs (``TrialRunner(reuse=False)`` turns this
  off). Everything else a trial sets (DDP kwargs, hook, precision, torch threads, DataLoader)
  is applied per trial inside ``run_rank``, which leaves nothing behind in the process.
* A trial with another environment gets fresh actors: the environment is their
  ``runtime_env``, so Ray starts new processes with the values in place before any process
  group exists, and NCCL, which reads its variables once per process, sees them. (Ray Train's
  TorchTrainer creates the process group before user code runs and costs 11-16 s per trial
  here; plain actors avoid both.)
* The driver waits for the ranks with a deadline. A rank that raises fails the trial with its
  first error line; a rank that hangs fails it with ``timeout``. After any failure (and on
  ``close``) every actor of the trial is killed, so the next trial starts fresh ones; a pool
  whose actors do not answer a short liveness check is replaced the same way.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from autotune.config import MeasureSettings, TrialConfig
from autotune.errors import ClusterLost, ConfigError, TrialFailed
from autotune.hardware import describe
from autotune.rank import NonFiniteLoss, RankSpec, run_rank
from autotune.stats import Interval, median_ci

__all__ = ["RankPlan", "RayConnection", "TrialResult", "TrialRunner", "connect", "plan_ranks"]

log = logging.getLogger(__name__)

#: How long a placement group may take to be placed before the run gives up.
PLACEMENT_TIMEOUT_S = 60.0
#: After a rank fails, how long to wait for the others to say whether their node died.
ROOT_CAUSE_WAIT_S = 3.0
#: How long the cluster may take to report a trial's node dead once its ranks say that a peer
#: or a process went away (Ray's health checks take a few seconds to declare a node dead).
NODE_DEATH_WAIT_S = 20.0
#: What a surviving rank says when its peer's process or node is gone.
_PEER_LOSS = ("connection closed by peer", "connection reset", "broken pipe", "socket closed")
#: How long a trial waits for the placement group to be placed again after a node was lost.
REPLACEMENT_TIMEOUT_S = 30.0
#: How long the pooled actors may take to answer before the pool is replaced by fresh ones.
POOL_CHECK_TIMEOUT_S = 5.0

#: Seconds to wait for a TCP answer from a given cluster address before giving up.
REACH_TIMEOUT_S = 5.0


@dataclass
class RayConnection:
    address: str | None
    started_here: bool
    owned: bool = True
    """False when Ray was already initialised by the caller (library use): left as found."""

    def close(self) -> None:
        import ray

        if self.owned and ray.is_initialized():
            ray.shutdown()


def _check_reachable(address: str) -> None:
    """Fail fast where ray.init would retry for minutes: nothing answers at HOST:PORT."""
    import ray._private.services as services

    fix = "start one with `ray start --head` or leave --address out to start a local instance"
    resolved = address
    if address == "auto":
        try:
            resolved = services.canonicalize_bootstrap_address(address)
        except Exception:
            resolved = None
        if not resolved:
            raise ConfigError(
                f"--address auto: no running Ray cluster found on this machine; {fix}"
            )
    host, sep, port = resolved.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--address {address}: expected auto or HOST:PORT (e.g. 127.0.0.1:6379)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as e:
        raise ConfigError(
            f"--address {address}: nothing answers there ({e.strerror or e}); {fix}"
        ) from None


def connect(address: str | None, *, extra_pythonpath: str | None = None) -> RayConnection:
    """Start a local Ray instance, or join the cluster at ``address`` (``auto``, HOST:PORT).

    A local instance is given ``extra_pythonpath`` so that workers import the user's trainer
    module from the directory the command was run in.
    """
    import ray

    if ray.is_initialized():
        return RayConnection(address=address, started_here=False, owned=False)
    if address is not None:
        _check_reachable(address)
    env_vars: dict[str, str] = {}
    if address is None and extra_pythonpath:
        env_vars["PYTHONPATH"] = os.pathsep.join(
            p for p in (extra_pythonpath, os.environ.get("PYTHONPATH", "")) if p
        )
    kwargs: dict[str, Any] = dict(
        logging_level=logging.WARNING,
        log_to_driver=False,
        configure_logging=True,
    )
    if env_vars:
        kwargs["runtime_env"] = {"env_vars": env_vars}
    if address is None:
        kwargs["include_dashboard"] = False
    try:
        # "local": always a new instance, even where RAY_ADDRESS or a `ray start` cluster
        # exists (Ray would join those on address=None); --address is how to join one.
        ray.init(address=address or "local", **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"--address {address}: Ray would not connect ({first}); if the cluster uses token "
            f"authentication, set RAY_AUTH_MODE=token and make its token available, else "
            f"start one with `ray start --head` or leave --address out"
        ) from None
    return RayConnection(address=address, started_here=address is None)


@dataclass(frozen=True)
class RankPlan:
    """How one trial's ranks sit on the cluster, read from its alive nodes' resources."""

    cpus_per_rank: int
    """CPUs each rank's bundle reserves: its node's CPUs shared by the ranks on that node, so
    that concurrent trials never share a core and the threads knob knows its range."""
    ranks_per_node: int
    """Ranks of one trial on one node: all of them (pack) or one per node (spread), as far
    as the nodes allow."""
    trials_fit: int
    """Trials whose ranks the cluster holds at once with that reservation (at least 1)."""
    nodes: int
    """Alive nodes with CPUs."""


def plan_ranks(
    world_size: int, backend: str, placement: str = "pack", trials: int | None = None
) -> RankPlan:
    """The plan for ``world_size`` ranks placed with ``placement`` on the connected cluster.

    One machine, 2 cores, 2 ranks: 1 CPU per rank, 1 trial. Four 8-core nodes, 2 ranks
    packed: 4 CPUs per rank, 4 trials at once, one per node; spread: 8 CPUs per rank, 2
    trials. With nccl each rank also takes a GPU, and a node's CPUs are shared by its GPUs."""
    import ray

    alive = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    return rank_plan(alive, world_size, backend, placement, trials)


def rank_plan(
    resources: list[dict[str, float]],
    world_size: int,
    backend: str,
    placement: str = "pack",
    trials: int | None = None,
) -> RankPlan:
    """``plan_ranks`` for nodes with these Ray resources (``{"CPU": 8, "GPU": 1}``...).
    ``trials``: that many trials must fit at once; the ranks' CPU share shrinks to make room
    (never below 1; whether they really fit is up to the placement groups)."""
    nodes = [r for r in resources if r.get("CPU", 0) >= 1]
    if backend == "nccl":
        nodes = [r for r in nodes if r.get("GPU", 0) >= 1]
    if not nodes:
        return RankPlan(cpus_per_rank=1, ranks_per_node=world_size, trials_fit=1, nodes=0)
    # Ranks one node can hold (nccl: one per GPU).
    room = [int(r["CPU"]) if backend != "nccl" else int(r["GPU"]) for r in nodes]
    if placement.endswith("pack") and max(room) >= world_size:
        per_node = world_size
    else:
        per_node = math.ceil(world_size / len(nodes))
    hosts = [r for r, slots in zip(nodes, room, strict=True) if slots >= per_node] or nodes
    if backend == "nccl":  # a node's CPUs are shared by its GPUs
        cpus = max(1, min(int(r["CPU"]) // max(1, int(r["GPU"])) for r in hosts))
    else:
        cpus = max(1, min(int(r["CPU"]) // per_node for r in hosts))

    def fit(cpus: int) -> int:
        if backend == "nccl":
            slots = [min(int(r["GPU"]), int(r["CPU"]) // cpus) for r in nodes]
        else:
            slots = [int(r["CPU"]) // cpus for r in nodes]
        return sum((n // per_node) * per_node for n in slots) // world_size

    while trials is not None and fit(cpus) < trials and cpus > 1:
        cpus -= 1
    return RankPlan(
        cpus_per_rank=cpus, ranks_per_node=per_node, trials_fit=max(1, fit(cpus)),
        nodes=len(nodes),
    )  # fmt: skip


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _free_port() -> tuple[str, int]:
    ip = _node_ip()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return ip, s.getsockname()[1]


class RankActor:
    """One DDP rank's process, kept for the following trials of the same environment.
    Wrapped with ``ray.remote`` in TrialRunner."""

    def __init__(self, env_keys: list[str]) -> None:
        import torch.distributed as dist

        # Taken when the process starts, before any process group: what NCCL would read.
        self.env_at_start = {k: os.environ.get(k) for k in env_keys}
        self.pg_at_start = dist.is_available() and dist.is_initialized()
        self.trials = 0
        self._store: Any = None

    def address(self, serve: bool = False) -> tuple[str, int]:
        """A free port on this node; also the pool's liveness check. With ``serve`` (rank 0),
        the next process group's store is started and listens there from now on: a rank that
        connects before the store listens backs off for 0.3-0.6 s (torch's retry)."""
        if not serve:
            return _free_port()
        import ray
        import torch.distributed as dist

        ip = ray.util.get_node_ip_address()
        self._store = dist.TCPStore(ip, 0, is_master=True, wait_for_workers=False)
        return ip, self._store.port

    def run(self, spec: RankSpec) -> dict[str, Any]:
        self.trials += 1
        store, self._store = self._store, None  # each store serves one process group
        out = run_rank(spec, store)
        out["env_at_start"] = self.env_at_start
        out["pg_at_start"] = self.pg_at_start
        out["process_trials"] = self.trials  # trials this process has run, this one included
        out["reused"] = self.trials > 1
        out["node_ip"] = _node_ip()
        return out


@dataclass
class TrialResult:
    """One trial's measurement, put together from its ranks."""

    ranks: list[dict[str, Any]]
    """Each rank's result, in rank order."""
    wall_s: float
    """Seconds from launching the ranks to having every result."""

    @property
    def windows(self) -> list[float]:
        """Samples/s over all ranks per timed window (the slowest rank's time; every rank
        holds the same list)."""
        return self.ranks[0]["windows"]

    @cached_property
    def interval(self) -> Interval:
        """Median of the windows with its 95 % interval."""
        return median_ci(self.windows)

    @property
    def throughput(self) -> float:
        """Samples/s over all ranks: the median window."""
        return self.interval.median

    @property
    def pruned(self) -> bool:
        return self.ranks[0]["stop"] == "pruned"

    @property
    def window_s(self) -> float:
        """Seconds inside timed windows."""
        return self.ranks[0]["window_s"]

    @property
    def step_time_s(self) -> float:
        """Seconds per optimizer step at the median throughput."""
        samples_per_step = sum(r["samples"] for r in self.ranks) / self.ranks[0]["steps"]
        return samples_per_step / self.throughput

    @property
    def overhead_s(self) -> float:
        """Seconds outside timed windows: process start and imports (fresh ranks only),
        process group, model, warm-up, and the result's way back."""
        return max(0.0, self.wall_s - self.window_s)


def _first_line(text: str) -> str:
    """The first meaningful line of an error text: not a traceback header, not blank."""
    for line in str(text).splitlines():
        line = line.strip()
        if line and not line.startswith(("Traceback", "File ", "^", "ray::")):
            return line[:300]
    return str(text).strip()[:300]


def _death_line(text: str) -> str:
    """Why Ray says an actor died: the line after its generic first line and tab-indented
    details (``The actor is dead because its worker process has died...``)."""
    lines = [line for line in text.splitlines() if line.strip()]
    for line in lines[1:]:
        if not line.startswith("\t"):
            return line.strip()[:300]
    return _first_line(text)


def _gone_away(f: TrialFailed) -> bool:
    """A failure that only says a peer or a rank's process went away (the symptom of a lost
    node, or of a process killed outright), not what a rank's own code raised."""
    text = f.detail.lower()
    return "its process died" in text or any(t in text for t in _PEER_LOSS)


def _failure(rank: int, err: BaseException) -> TrialFailed:
    import ray.exceptions as rex

    cause = getattr(err, "cause", None) or err
    if isinstance(err, rex.RayActorError) and not isinstance(err, rex.RayTaskError):
        why = _death_line(str(err))
        if "node" in why.lower() and ("died" in why or "dead" in why):
            return TrialFailed("node_lost", f"rank {rank}: its node was lost ({why})")
        return TrialFailed("crash", f"rank {rank}: its process died ({why})")
    if isinstance(cause, NonFiniteLoss):
        return TrialFailed("nan", f"rank {rank}: {cause}")
    text = f"{type(cause).__name__}: {_first_line(str(cause))}"
    if isinstance(cause, MemoryError) or "OutOfMemoryError" in text or "out of memory" in text:
        return TrialFailed("oom", f"rank {rank}: {text}")
    return TrialFailed("crash", f"rank {rank}: {text}")


class TrialRunner:
    """Runs trials of ``world_size`` ranks, one at a time, in one placement group.

    ``reuse=False`` starts fresh rank processes for every trial (the behaviour before the
    pool; useful to compare overheads).
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
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group

        self.reuse = reuse
        self._pool: list[Any] = []  # the rank actors of the last successful trial, by rank
        self._pool_env: dict[str, str] | None = None  # the environment they were started with
        self.world_size = world_size
        self.backend = backend
        self.gpus_per_rank = 1 if backend == "nccl" else 0
        self.cpus_per_rank = cpus_per_rank
        bundle = {"CPU": cpus_per_rank, **({"GPU": 1} if self.gpus_per_rank else {})}
        self.strategy = strategy.upper()
        self.pg = placement_group([dict(bundle) for _ in range(world_size)], strategy=self.strategy)
        try:
            ray.get(self.pg.ready(), timeout=placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            have = ray.available_resources()
            ray.util.remove_placement_group(self.pg)
            raise ConfigError(
                f"--world-size {world_size}: the Ray cluster cannot place {world_size} ranks of "
                f"{bundle} with --placement {self.strategy.lower()} (free: "
                f"CPU={have.get('CPU', 0):g}, GPU={have.get('GPU', 0):g}); lower --world-size "
                f"or --concurrent-trials, choose another --placement, or add nodes"
            ) from None
        self._actor_cls = ray.remote(max_restarts=0, max_task_retries=0)(RankActor)
        self._probe_fn = ray.remote(describe)

    def _strategy(self, index: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(
            placement_group=self.pg, placement_group_bundle_index=index
        )

    def abort(self) -> None:
        """Kill the running trial's ranks now (Ctrl-C from another thread): the trial then
        fails at once instead of running to its end."""
        self._drop_pool()

    def probe(self) -> dict[str, Any]:
        """The hardware seen from rank 0's bundle, plus the number of nodes the ranks span."""
        import ray

        self._drop_pool()  # pooled actors hold the bundles' CPUs: the probe would never start
        info = ray.get(
            self._probe_fn.options(
                num_cpus=self.cpus_per_rank,
                num_gpus=self.gpus_per_rank,
                scheduling_strategy=self._strategy(0),
            ).remote(self.backend)
        )
        info["node_count"] = len(set(self._bundle_nodes().values())) or 1
        return info

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
    ) -> TrialResult:
        """Run one trial; raises TrialFailed with the reason when it produces no result."""
        import ray
        import ray.exceptions as rex

        self.ensure_placed()
        started = time.monotonic()
        deadline = started + timeout_s
        keep = False
        try:
            addr, port = self._ranks(config.env, deadline)
            nodes = self._bundle_nodes()
            actors = self._pool
            refs = {
                actors[i].run.remote(
                    RankSpec(
                        trial=trial,
                        rank=i,
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
                        incumbent=None if incumbent is None else incumbent.to_dict(),
                    )
                ): i
                for i in range(self.world_size)
            }
            results: list[dict[str, Any]] = []
            pending = list(refs)
            while pending:
                left = deadline - time.monotonic()
                done, pending = ray.wait(pending, num_returns=1, timeout=max(left, 0))
                if not done:
                    stuck = sorted(refs[r] for r in pending)
                    raise TrialFailed(
                        "timeout", f"no result after {timeout_s:.0f}s from rank(s) {stuck}"
                    )
                try:
                    results.append(ray.get(done[0]))
                except rex.RayError as e:
                    first = _failure(refs[done[0]], e)
                    raise self._root_cause(first, pending, refs, nodes) from None
            keep = self.reuse
        finally:
            # Any failure (crash, timeout, nan, oom, node lost, Ctrl-C) kills every rank, and
            # with them their DataLoader workers: a failed trial's processes are never reused.
            if not keep:
                self._drop_pool()
        results.sort(key=lambda r: r["rank"])
        return TrialResult(ranks=results, wall_s=time.monotonic() - started)

    def _ranks(self, env: dict[str, str], deadline: float) -> tuple[str, int]:
        """Make ``self._pool`` the trial's rank actors; return rank 0's address for the process
        group (a new port every trial). The pool serves when it was started with ``env`` and
        every actor answers at once; otherwise it is killed and fresh actors are started."""
        import ray
        import ray.exceptions as rex

        if self._pool and self._pool_env == env:
            pings = [a.address.remote(serve=i == 0) for i, a in enumerate(self._pool)]
            until = time.monotonic() + POOL_CHECK_TIMEOUT_S
            answers: list[tuple[str, int]] = []
            try:
                for ping in pings:
                    answers.append(ray.get(ping, timeout=max(until - time.monotonic(), 0)))
                return answers[0]
            except rex.GetTimeoutError:  # a stuck actor: never fail the trial for it
                log.info("rank %d of the pool did not answer; starting fresh ranks", len(answers))
            except rex.RayError as e:
                died = _failure(len(answers), e)
                if died.reason == "node_lost":  # no fresh rank could be placed there either
                    self._drop_pool()
                    raise died from None
                log.info("pool rank gone (%s); starting fresh ranks", died.detail)
        self._drop_pool()
        self._pool = [
            self._actor_cls.options(
                num_cpus=self.cpus_per_rank,
                num_gpus=self.gpus_per_rank,
                scheduling_strategy=self._strategy(i),
                runtime_env={"env_vars": dict(env)},
            ).remote(sorted(env))
            for i in range(self.world_size)
        ]
        self._pool_env = dict(env)
        try:
            left = max(deadline - time.monotonic(), 1.0)  # the trial's deadline holds
            return ray.get(self._pool[0].address.remote(serve=True), timeout=left)
        except rex.GetTimeoutError:
            raise TrialFailed("timeout", f"rank processes did not start in {left:.0f}s") from None
        except rex.RayError as e:
            raise _failure(0, e) from None

    def _drop_pool(self) -> None:
        """Kill the pooled rank actors (their processes and DataLoader workers go with them)."""
        import ray

        for a in self._pool:
            ray.kill(a, no_restart=True)
        self._pool, self._pool_env = [], None

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
        node id, taken when the trial started) is gone, and prefer ``node_lost``."""
        import ray
        import ray.exceptions as rex

        if first.reason == "node_lost":
            return first
        symptoms = [first]
        if pending:
            done, _ = ray.wait(pending, num_returns=len(pending), timeout=ROOT_CAUSE_WAIT_S)
            for ref in done:
                try:
                    ray.get(ref)
                except rex.RayError as e:
                    other = _failure(refs[ref], e)
                    if other.reason == "node_lost":
                        return other
                    symptoms.append(other)
        if not all(_gone_away(f) for f in symptoms):
            return first  # a rank's own error: the configuration's failure, not the cluster's
        until = time.monotonic() + NODE_DEATH_WAIT_S
        while True:
            alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
            lost = sorted(rank for rank, node in nodes.items() if node not in alive)
            if lost:
                return TrialFailed(
                    "node_lost",
                    f"rank {lost[0]}: its node was lost (the cluster reports node "
                    f"{nodes[lost[0]][:12]} dead; first error: {first.detail})",
                )
            if time.monotonic() >= until:
                return first
            time.sleep(0.5)

    def _bundle_nodes(self) -> dict[int, str]:
        """Rank -> the id of the node its bundle is placed on."""
        from ray.util import placement_group_table

        placed = placement_group_table(self.pg).get("bundles_to_node_id", {})
        return {i: placed[i] for i in range(self.world_size) if i in placed}

    def ensure_placed(self) -> None:
        """After a node loss Ray re-places the group's bundles; wait for that, or stop."""
        import ray
        from ray.util import placement_group_table

        if placement_group_table(self.pg).get("state") == "CREATED":
            return
        try:
            ray.get(self.pg.ready(), timeout=REPLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            have = ray.available_resources()
            raise ClusterLost(
                f"the Ray cluster lost capacity and cannot place {self.world_size} ranks again "
                f"(free now: CPU={have.get('CPU', 0):g}, GPU={have.get('GPU', 0):g}); add nodes "
                f"or lower --world-size, then run the same command to resume"
            ) from None

    def close(self) -> None:
        import ray

        if ray.is_initialized():
            self._drop_pool()
            ray.util.remove_placement_group(self.pg)
