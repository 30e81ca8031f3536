"""The rank processes of one placement group: a warm pool keyed by the process environment.

A trial whose environment (``config.env``: ``NCCL_*``, ``OMP_NUM_THREADS``) equals the previous
trial's runs in the previous trial's processes, which saves process start, imports and
first-use costs. Everything else a trial sets (DDP kwargs, hook, precision, torch threads,
DataLoader) is applied per trial inside ``rank.run_rank``, which leaves nothing behind in the
process. A trial with another environment gets fresh actors: the environment is their
``runtime_env``, so Ray starts new processes with the values in place before any process group
exists, and NCCL, which reads its variables once per process, sees them.

``RankPool`` is used by one ``launcher.TrialRunner`` from the thread running its trial;
``drop`` may also be called from another thread (Ctrl-C) to kill the ranks of a running trial.

Where the ranks listen: rank 0's store on its node's address as Ray knows it (``node_ip``), and
nowhere else. On a local instance that address is 127.0.0.1, and the ranks also get
``GLOO_SOCKET_IFNAME=lo`` and ``NCCL_SOCKET_IFNAME=lo`` (``LOOPBACK_ENV``), so gloo and NCCL
listen on loopback too; on a cluster they use what the node's ``ray start`` environment says
(the network lab: ``GLOO_SOCKET_IFNAME=lab``), else gloo the address its hostname resolves to.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from typing import Any

from autotune.core import allocator
from autotune.core.errors import FailureReason, TrialFailed
from autotune.core.rank_io import RankResult, RankSpec
from autotune.launch.failures import classify
from autotune.launch.hardware import describe
from autotune.rank.measure import run_rank
from autotune.rank.session import listening_store

__all__ = ["LOOPBACK_ENV", "RankActor", "RankPool", "node_ip"]

log = logging.getLogger(__name__)

#: How long the pooled actors may take to answer before the pool is replaced by fresh ones.
POOL_CHECK_TIMEOUT_S = 5.0
#: The ranks' environment on a local instance (node IP 127.0.0.1): gloo and NCCL listen on the
#: loopback interface, not on the address the hostname resolves to or the first one they find.
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}


def node_ip() -> str:
    """This node's address as Ray knows it."""
    import ray

    return ray.util.get_node_ip_address()


def _free_port() -> tuple[str, int]:
    ip = node_ip()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return ip, s.getsockname()[1]


class RankActor:
    """One DDP rank's process, kept for the following trials of the same environment.
    Wrapped with ``ray.remote`` by ``RankPool``."""

    def __init__(self, env_keys: list[str], pin: bool = True) -> None:
        import torch.distributed as dist

        # Before anything of the workload is allocated (see autotune.core.allocator); where the C
        # library is not glibc there is nothing to pin. Only the re-validation's run of the job
        # as the user runs it today (``pin=False``) leaves glibc as it starts a process.
        if pin:
            allocator.pin()
        #: Whether glibc's thresholds are pinned, as each result says: read back from what glibc
        #: does where the pin was asked for (``allocator.pinned``), else from the environment
        #: glibc read at the process's start (the probe would pin an unpinned process).
        self.allocator_pinned = allocator.pinned() if pin else allocator.pinned_by_env(os.environ)
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
        ip = node_ip()
        self._store = listening_store(ip)
        return ip, self._store.port

    def describe(self, backend: str) -> dict[str, Any]:
        """The hardware this rank's process sees (``hardware.describe``)."""
        return describe(backend)

    def run(self, spec: RankSpec) -> RankResult:
        self.trials += 1
        store, self._store = self._store, None  # each store serves one process group
        out = run_rank(spec, store)
        out.env_at_start = self.env_at_start
        out.pg_at_start = self.pg_at_start
        out.process_trials = self.trials
        out.reused = self.trials > 1
        out.node_ip = node_ip()
        out.applied["allocator_pinned"] = self.allocator_pinned
        return out


class RankPool:
    """The rank actors of one placement group (bundle ``i`` holds rank ``i``).

    ``ready(env, deadline)`` makes ``actors`` the next trial's ranks: the pool when it was
    started with ``env`` and every actor answers at once, else fresh actors; it returns rank
    0's address for the trial's process group (a new port every trial). ``describe`` asks rank
    0's process what hardware it sees, in a pool started (or kept) for an environment: the run's
    hardware probe, whose processes the first trial with that environment then runs in, without
    starting processes and importing torch twice. ``drop()`` kills them
    (their processes and DataLoader workers go with them). ``fresh`` asks for new processes
    whatever the pool holds; ``pin=False`` for processes that never pin glibc's allocator
    (the job as it runs today): a pool is reused only for the same environment and pin, since
    ``mallopt`` cannot be undone in a process.
    """

    def __init__(
        self, *, strategy: Any, world_size: int, cpus_per_rank: float, gpus_per_rank: int
    ) -> None:
        import ray

        self._strategy = strategy  # bundle index -> Ray scheduling strategy
        self.world_size = world_size
        self.cpus_per_rank = cpus_per_rank
        self.gpus_per_rank = gpus_per_rank
        self.actors: list[Any] = []  # the rank actors of the last successful trial, by rank
        self._env: dict[str, str] | None = None  # the environment they were started with
        self._pin = True  # whether they pinned the allocator
        self._actor_cls = ray.remote(max_restarts=0, max_task_retries=0)(RankActor)
        # Where the ranks' gloo and NCCL listen: loopback on a local instance, else as the
        # node's own environment says.
        self._listen_env = LOOPBACK_ENV if ipaddress.ip_address(node_ip()).is_loopback else {}

    def describe(self, env: dict[str, str], backend: str, deadline: float) -> dict[str, Any]:
        """The hardware seen by rank 0's process (``hardware.describe``), in rank actors for
        process environment ``env`` (``ready``), which stay for the next trial."""
        import ray
        import ray.exceptions as rex

        self.ready(env, deadline, serve=False)
        try:
            return ray.get(
                self.actors[0].describe.remote(backend),
                timeout=max(deadline - time.monotonic(), 1.0),
            )
        except rex.GetTimeoutError:
            raise TrialFailed(FailureReason.TIMEOUT, "rank 0 did not answer in time") from None
        except rex.RayError as e:
            raise classify(0, e) from None

    def ready(
        self,
        env: dict[str, str],
        deadline: float,
        *,
        fresh: bool = False,
        pin: bool = True,
        serve: bool = True,
    ) -> tuple[str, int]:
        """Rank actors for a trial with process environment ``env`` (``fresh`` and ``pin``:
        the class doc); rank 0's address, where its store listens from now on unless
        ``serve`` is False (no process group follows)."""
        import ray
        import ray.exceptions as rex

        if self.actors and self._env == env and self._pin == pin and not fresh:
            pings = [a.address.remote(serve=serve and i == 0) for i, a in enumerate(self.actors)]
            until = time.monotonic() + POOL_CHECK_TIMEOUT_S
            answers: list[tuple[str, int]] = []
            try:
                for ping in pings:
                    answers.append(ray.get(ping, timeout=max(until - time.monotonic(), 0)))
                return answers[0]
            except rex.GetTimeoutError:  # a stuck actor: never fail the trial for it
                log.info("rank %d of the pool did not answer; starting fresh ranks", len(answers))
            except rex.RayError as e:
                died = classify(len(answers), e)
                if died.reason == FailureReason.NODE_LOST:  # no fresh rank could start there
                    self.drop()
                    raise died from None
                log.info("pool rank gone (%s); starting fresh ranks", died.detail)
        self.drop()
        self.actors = [
            self._actor_cls.options(
                num_cpus=self.cpus_per_rank,
                num_gpus=self.gpus_per_rank,
                scheduling_strategy=self._strategy(i),
                # where the ranks listen is the run's to say: its settings come last
                runtime_env={"env_vars": {**env, **self._listen_env}},
            ).remote(sorted(env), pin)
            for i in range(self.world_size)
        ]
        self._env, self._pin = dict(env), pin
        try:
            left = max(deadline - time.monotonic(), 1.0)  # the trial's deadline holds
            return ray.get(self.actors[0].address.remote(serve=serve), timeout=left)
        except rex.GetTimeoutError:
            raise TrialFailed(
                FailureReason.TIMEOUT, f"rank processes did not start in {left:.0f}s"
            ) from None
        except rex.RayError as e:
            raise classify(0, e) from None

    def drop(self) -> None:
        """Kill the pooled rank actors (their processes and DataLoader workers go with them)."""
        import ray

        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors, self._env = [], None
