"""Ray as the run sees it: start a local instance or join a cluster, and plan how one trial's
ranks sit on its nodes.

* ``connect(address)`` starts a local Ray instance (``address=None`` and no ``RAY_ADDRESS``)
  or joins an existing cluster (``auto`` or ``HOST:PORT``, from the flag or ``RAY_ADDRESS``),
  failing in seconds with a one-line error when nothing answers there or the address is Ray
  Client's or the dashboard's (``launch.address``). A local instance's node IP is 127.0.0.1:
  all its servers listen on loopback only (``core.compat.loopback_node_ip``), and so do the
  ranks' rendezvous and gloo (``pool``). A cluster's nodes keep the address they were started
  with.
* A local instance is this user's alone. It runs with token authentication, set explicitly
  (``RAY_AUTH_MODE=token``: Ray warns when it turns it on by default), its token fresh
  (``secrets``) and only in the environment of the driver and of the processes the instance
  starts (``RAY_AUTH_TOKEN``; nothing is written to ``~/.ray``), and keeps its sockets, logs
  and session files in a temp dir of its own, mode 0700 (``RAY_TMPDIR``), not in the shared
  ``/tmp/ray``. ``close`` removes that dir and restores the environment.
* A local instance leaves no process behind, and ``close`` ends nothing else: the processes
  this run started (``launch.reaper``: this user's, descended from the driver, which is their
  child subreaper, and marked with ``OWNER_ENV``, a value unique to the run, or recorded with
  their start time), never a process found by a path or a name. ``close`` (and a Ctrl-C or
  SIGTERM that interrupts ``ray.init``) shuts Ray down, then kills those left. Interrupting
  ``ray.init`` used to leave the raylet's DashboardAgent and RuntimeEnvAgent running,
  orphaned, ignoring SIGTERM (2.5 s and 4 s into ``autotune run``). A Ray that the caller
  initialised (library use) is left as found.
* ``plan_ranks`` reads the alive nodes' resources and says how many CPUs each rank's bundle
  reserves and how many trials fit at once (``rank_plan`` is the same over given resources:
  pure, unit-tested on many cluster shapes).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from autotune.core.compat import loopback_node_ip, reread_ray_config
from autotune.core.errors import ConfigError, Terminated
from autotune.launch import address as addr
from autotune.launch.reaper import OWNER_ENV, Reaper
from autotune.rank.workload import TRAINER_DIR_ENV

__all__ = ["RankPlan", "RayConnection", "connect", "plan_ranks", "rank_plan"]

#: Where Ray puts a local instance's sockets below its temp dir (a PID at its longest); a Unix
#: socket's path holds 107 bytes at most.
_SOCKET_TAIL = "/ray/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store"
_UNIX_PATH_MAX = 107
_TEMP_PREFIX = "autotune-ray-"
#: What a shipped working directory leaves out.
SHIP_EXCLUDES = (".git", "__pycache__", ".venv")
#: The variables a local instance started here runs with; restored when it closes.
_PRIVATE_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_TMPDIR")
#: Ray's driver reads it as it prints a line of its own ("0": no colour codes).
_COLOR_VAR = "RAY_COLOR_PREFIX"


@functools.cache
def _token() -> str:
    """The local instances' token: one per process (Ray's driver reads its token once)."""
    return secrets.token_hex(32)


def _temp_parent() -> str:
    """Where a local instance's temp dir goes: ``RAY_TMPDIR`` or the system's temp dir, or
    /tmp where the sockets' paths below it would be too long."""
    parent = os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()
    room = _UNIX_PATH_MAX - len(_SOCKET_TAIL) - len(_TEMP_PREFIX) - len("/12345678")
    return parent if len(parent) <= room else "/tmp"


@dataclass
class _Private:
    """A local instance's own token and temp dir (mode 0700, this user's), set in the
    environment while it runs, and the environment as it was before."""

    temp_dir: str
    before: dict[str, str | None]

    @classmethod
    def enter(cls) -> _Private:
        before = {k: os.environ.get(k) for k in _PRIVATE_VARS}
        temp_dir = tempfile.mkdtemp(prefix=_TEMP_PREFIX, dir=_temp_parent())
        # Token authentication, said explicitly (where RAY_AUTH_MODE is unset Ray turns it on
        # all the same, and warns that it did): the driver and every process the instance
        # starts; RAY_AUTH_TOKEN wins over any token file, and no token is written to ~/.ray.
        os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=_token(), RAY_TMPDIR=temp_dir)
        reread_ray_config()  # this driver's Ray read RAY_AUTH_MODE when it was imported
        return cls(temp_dir, before)

    def leave(self) -> None:
        for k, v in self.before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        reread_ray_config()
        _remove_tree(self.temp_dir)


def _remove_tree(path: str, wait_s: float = 2.0) -> None:
    """Remove the instance's temp dir, again while a file appears in it as it goes (a
    process of the instance that was still ending); what cannot be removed is said."""
    until = time.monotonic() + wait_s
    while True:
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path) or time.monotonic() >= until:
            break
        time.sleep(0.1)
    if os.path.lexists(path):
        logging.getLogger(__name__).warning(
            "could not remove the local Ray instance's temp dir %s; remove it by hand", path
        )


def _end(reaper: Reaper | None, private: _Private | None) -> None:
    """Shut the local instance down and end what it started, then remove its temp dir and
    restore the environment."""
    import ray

    try:
        if reaper is not None:
            reaper.end(ray.shutdown)
    finally:
        if private is not None:
            private.leave()


@dataclass
class RayConnection:
    address: str | None
    started_here: bool
    owned: bool = True
    """False when Ray was already initialised by the caller (library use): left as found."""
    from_env: bool = False
    """The address came from ``RAY_ADDRESS``, not ``--address``."""
    owner: str | None = None
    """``OWNER_ENV``'s value in the processes of the local instance started here."""
    session_dir: str | None = None
    """The local instance's session directory, as ``ray.init`` returned it."""
    reaper: Reaper | None = None
    private: _Private | None = None
    color_set: bool = False
    """``RAY_COLOR_PREFIX`` was set by ``connect`` (``_plain_ray_lines``): unset on close."""

    def describe(self) -> str | None:
        """The line a run prints about a cluster it joined; None for a local instance."""
        if self.address is None or not self.owned:
            return None
        return f"Joined the Ray cluster at {self.address}" + (
            " (RAY_ADDRESS)" if self.from_env else ""
        )

    def close(self) -> None:
        import ray

        try:
            if self.owned and self.reaper is not None:
                reaper, self.reaper = self.reaper, None
                _end(reaper, self.private)
            elif self.owned and ray.is_initialized():
                ray.shutdown()
        finally:
            if self.color_set:
                self.color_set = False
                os.environ.pop(_COLOR_VAR, None)


def _plain_ray_lines() -> bool:
    """Where this process's stdout is not a terminal (a pipe, a log file), the lines Ray's
    driver prints itself (a worker's death, from the raylet, even with ``log_to_driver``
    off) come without colour codes: ``RAY_COLOR_PREFIX=0``, unless the user set it. True when
    it was set here (``RayConnection.close`` restores it)."""
    if sys.stdout.isatty() or _COLOR_VAR in os.environ:
        return False
    os.environ[_COLOR_VAR] = "0"
    return True


def connect(
    address: str | None, *, trainer_dir: str | None = None, working_dir: str | None = None
) -> RayConnection:
    """Start a local Ray instance, or join the cluster at ``address`` (``auto``, HOST:PORT).

    A local instance is given ``trainer_dir`` (``TRAINER_DIR_ENV``), the directory of a
    ``--trainer module:function`` of the user's: its ranks append it to ``sys.path`` when they
    import the trainer (``rank.workload``), last, and nothing else of it is on their path (a
    file there named as a module of Python's or a ``sitecustomize.py`` is never imported).
    ``working_dir``: a directory every worker of this job runs in, shipped by Ray's runtime
    environment (script mode on nodes that do not see its files: ``script.nodes``).
    """
    import ray

    if ray.is_initialized():
        return RayConnection(address=address, started_here=False, owned=False)
    addr.check_address(address)
    address, from_env = addr.resolve(address)
    # A cluster whose head listens on loopback (a local `ray start --head` like autotune's own
    # local instance) is joined with this node's IP as 127.0.0.1 too: Ray looks for the node's
    # raylet at the driver's node IP.
    loopback = address is None or addr.is_loopback(addr.check_reachable(address, from_env))
    kwargs = _init_kwargs(address, trainer_dir, working_dir)
    if address == "auto":
        addr.check_auto_owner(from_env)
        addr.auth_as_ray_would()
    owner = f"{os.getpid()}-{uuid.uuid4().hex}" if address is None else None
    try:
        with _marked(owner):  # inherited by everything the instance starts
            context, reaper, private = _init(address, kwargs, loopback, owner)
    except SystemExit as e:  # ray.init's own SIGTERM handler exits with the signal's number
        if e.code == signal.SIGTERM:
            Terminated.received = True
            raise Terminated() from None
        raise
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise _refused(e, address, from_env) from None
    return RayConnection(
        address=address,
        started_here=address is None,
        from_env=from_env,
        owner=owner,
        session_dir=context.address_info.get("session_dir") if owner else None,
        reaper=reaper,
        private=private,
        color_set=_plain_ray_lines(),
    )


def _init_kwargs(
    address: str | None, trainer_dir: str | None, working_dir: str | None = None
) -> dict[str, Any]:
    """``ray.init``'s arguments: quiet, and for a local instance no dashboard and the
    ``trainer_dir`` in its workers' environment (``TRAINER_DIR_ENV``); with ``working_dir``,
    that directory shipped to the job's workers (Ray takes a local directory at the job level
    only, not per task)."""
    env_vars: dict[str, str] = {}
    if address is None and trainer_dir:
        env_vars[TRAINER_DIR_ENV] = trainer_dir
    kwargs: dict[str, Any] = dict(
        logging_level=logging.WARNING,
        log_to_driver=False,
        configure_logging=True,
    )
    runtime_env: dict[str, Any] = {"env_vars": env_vars} if env_vars else {}
    if working_dir:
        runtime_env.update(working_dir=working_dir, excludes=list(SHIP_EXCLUDES))
    if runtime_env:
        kwargs["runtime_env"] = runtime_env
    if address is None:
        kwargs["include_dashboard"] = False
    return kwargs


@contextlib.contextmanager
def _marked(owner: str | None) -> Iterator[None]:
    """``OWNER_ENV`` set to ``owner`` in this process's environment (so in every process
    started meanwhile), then restored; nothing is set when ``owner`` is None."""
    before = os.environ.get(OWNER_ENV)
    try:
        if owner is not None:
            os.environ[OWNER_ENV] = owner
        yield
    finally:
        if before is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = before


def _init(
    address: str | None, kwargs: dict[str, Any], loopback: bool, owner: str | None
) -> tuple[Any, Reaper | None, _Private | None]:
    """``ray.init``, its context, and for a local instance (``owner``) the reaper of what it
    starts and its private token and temp dir. A start that fails or is interrupted leaves no
    process of a local instance behind."""
    import ray

    reaper: Reaper | None = None
    private: _Private | None = None
    try:
        if owner is not None:
            private = _Private.enter()
            reaper = Reaper(owner)
            reaper.adopt()  # every process the instance starts stays below this one
        # "local": always a new instance, even where a `ray start` cluster exists (Ray
        # would join it on address=None); --address or RAY_ADDRESS is how to join one.
        # Its node IP is 127.0.0.1, so nothing of it listens beyond loopback.
        with loopback_node_ip() if loopback else contextlib.nullcontext():
            context = ray.init(address=address or "local", **kwargs)
        if reaper is not None:
            reaper.record(started=True)
            if os.environ.get("RAY_AUTH_MODE") != "token":
                raise RuntimeError("Ray started it without token authentication")
    except BaseException:  # a start that failed or was interrupted leaves nothing
        if owner is not None:
            _end(reaper, private)
        raise
    return context, reaper, private


def _refused(e: Exception, address: str | None, from_env: bool) -> ConfigError:
    """The one-line error for a Ray that would not connect, naming its first line."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if address is None:
        return ConfigError(
            f"the local Ray instance did not start ({first}); join a running cluster with "
            f"--address instead"
        )
    return ConfigError(
        f"{addr.flag_of(str(address), from_env)}: Ray would not connect ({first}); if the "
        f"cluster uses token authentication, set RAY_AUTH_MODE=token and make its token "
        f"available, else start one with `ray start --head` or "
        f"{addr.leave_hint(from_env)}"
    )


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
        cpus_per_rank=cpus,
        ranks_per_node=per_node,
        trials_fit=max(1, fit(cpus)),
        nodes=len(nodes),
    )
