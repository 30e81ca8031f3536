"""Ray as the run sees it: start a local instance or join a cluster, and plan how one trial's
ranks sit on its nodes.

* ``connect(address)`` starts a local Ray instance (``address=None`` and no ``RAY_ADDRESS``)
  or joins an existing cluster (``auto`` or ``HOST:PORT``, from the flag or ``RAY_ADDRESS``),
  failing in seconds with a one-line error when nothing
  answers there. A local instance's node IP is 127.0.0.1: all its servers listen on loopback
  only (``core.compat.loopback_node_ip``), and so do the ranks' rendezvous and gloo (``pool``). A
  cluster's nodes keep the address they were started with.
* A local instance leaves no process behind. Every process it starts carries
  ``OWNER_ENV`` (a value unique to this run) in its environment; ``close`` (and a Ctrl-C or
  SIGTERM that interrupts ``ray.init``) shuts Ray down, then ends whatever still carries the
  value (``_reap``). Interrupting ``ray.init`` used to leave the raylet's DashboardAgent and
  RuntimeEnvAgent running, orphaned, ignoring SIGTERM (2.5 s and 4 s into ``autotune run``).
* ``plan_ranks`` reads the alive nodes' resources and says how many CPUs each rank's bundle
  reserves and how many trials fit at once (``rank_plan`` is the same over given resources:
  pure, unit-tested on many cluster shapes).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import math
import os
import re
import signal
import socket
import time
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.core.compat import bootstrap_address, loopback_node_ip
from autotune.core.errors import ConfigError, Terminated

__all__ = ["RankPlan", "RayConnection", "connect", "plan_ranks", "rank_plan"]

#: Seconds to wait for a TCP answer from a given cluster address before giving up.
REACH_TIMEOUT_S = 5.0
#: The environment variable that marks the processes of a local instance started here.
OWNER_ENV = "AUTOTUNE_RAY_OWNER"
#: Seconds the marked processes get to end by themselves after ``ray.shutdown``.
REAP_GRACE_S = 1.5


#: A Ray session directory inside a path: ``.../session_2026-11-25_06-45-09_749085_17907``.
_SESSION = re.compile(r"(/\S*?/session_(?!latest)[^/\s]+)")


def _processes(proc: Path) -> Iterator[tuple[int, Path]]:
    me = os.getpid()
    for entry in proc.glob("[0-9]*"):
        if entry.name.isdigit() and int(entry.name) != me:
            yield int(entry.name), entry


def _cmdline(entry: Path) -> list[str]:
    return (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")


def _open_files(entry: Path) -> list[str]:
    """The targets of one process's open files (none of another user's process)."""
    out = []
    with contextlib.suppress(OSError):
        for fd in (entry / "fd").iterdir():
            with contextlib.suppress(OSError):
                out.append(os.readlink(fd))
    return out


def session_dirs(pids: list[int], proc: Path = Path("/proc")) -> set[str]:
    """The Ray session directories these processes name on their command line or hold files
    in (the GCS and the raylet name theirs)."""
    found: set[str] = set()
    for pid in pids:
        entry = proc / str(pid)
        with contextlib.suppress(OSError):
            for path in _cmdline(entry) + _open_files(entry):
                found.update(m.group(1) for m in _SESSION.finditer(path))
    return found


def _ray_inside(entry: Path, sessions: Collection[str]) -> bool:
    """A process of Ray's own (``ray::...``, or a program of the ``ray`` package) that names
    or holds a path in one of ``sessions``; a user's ``tail -f`` on a session log is not.
    Its open files are read only once its command line shows it is Ray's."""
    argv = _cmdline(entry)
    if not (argv[0].startswith("ray::") or any("/ray/" in a for a in argv[:2])):
        return False
    paths = argv + _open_files(entry)
    return any(d + "/" in p or p.endswith(d) for p in paths for d in sessions)


def owned_processes(
    owner: str, sessions: Collection[str] = (), proc: Path = Path("/proc")
) -> list[int]:
    """PIDs of the processes (other than this one) of the local instance started here: those
    whose environment holds ``OWNER_ENV`` = ``owner`` (its GCS, raylet, agents, workers and
    theirs), and Ray's own processes with a file open in, or naming on their command line,
    one of its ``sessions`` (``session_dirs``). The second rule is for the raylet's agents:
    once they rename themselves (``ray::DashboardAgent``) their environment can read back
    empty. Another instance (a ``ray start`` cluster of the user's) has another session. Linux
    only (an empty list where there is no ``/proc``); only the user's own processes can be
    read, so no one else's is ever named."""
    needle = f"{OWNER_ENV}={owner}".encode()
    found = []
    for pid, entry in _processes(proc):
        try:
            marked = needle in (entry / "environ").read_bytes().split(b"\0")
            if marked or (sessions and _ray_inside(entry, sessions)):
                found.append(pid)
        except OSError:  # gone, or another user's
            continue
    return found


def _reap(owner: str, grace_s: float = REAP_GRACE_S) -> list[int]:
    """Shut Ray down, give the processes it started ``grace_s`` to end, kill what is left;
    the PIDs killed."""
    import ray

    sessions = session_dirs(owned_processes(owner))  # while the GCS and raylet still run
    ray.shutdown()
    until = time.monotonic() + grace_s
    while (left := owned_processes(owner, sessions)) and time.monotonic() < until:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if left:
        logging.getLogger(__name__).info("killed %d process(es) Ray left: %s", len(left), left)
    return left


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

    def describe(self) -> str | None:
        """The line a run prints about a cluster it joined; None for a local instance."""
        if self.address is None or not self.owned:
            return None
        return f"Joined the Ray cluster at {self.address}" + (
            " (RAY_ADDRESS)" if self.from_env else ""
        )

    def close(self) -> None:
        import ray

        if self.owned and self.owner is not None:
            _reap(self.owner)
        elif self.owned and ray.is_initialized():
            ray.shutdown()


def _address_flag(address: str, from_env: bool) -> str:
    """How an error names the address: the flag, or the variable it came from."""
    return f"RAY_ADDRESS={address}" if from_env else f"--address {address}"


def _leave(from_env: bool) -> str:
    """How an error says to start a local instance instead."""
    return "unset RAY_ADDRESS" if from_env else "leave --address out"


def _check_reachable(address: str, from_env: bool = False) -> str:
    """Fail fast where ray.init would retry for minutes: nothing answers at HOST:PORT. Returns
    the host that answered."""
    name = _address_flag(address, from_env)
    leave = _leave(from_env)
    fix = f"start one with `ray start --head` or {leave} to start a local instance"
    resolved = address
    if address == "auto":
        resolved = bootstrap_address(address)
        if not resolved:
            raise ConfigError(f"{name}: no running Ray cluster found on this machine; {fix}")
    host, sep, port = resolved.rpartition(":")
    if not sep or not port.isdigit() or "/" in host:
        raise ConfigError(
            f"{name}: expected auto or HOST:PORT, the cluster's GCS address (e.g. "
            f"127.0.0.1:6379); {leave} to start a local instance"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as e:
        raise ConfigError(f"{name}: nothing answers there ({e.strerror or e}); {fix}") from None
    return host.strip("[]")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def connect(address: str | None, *, extra_pythonpath: str | None = None) -> RayConnection:
    """Start a local Ray instance, or join the cluster at ``address`` (``auto``, HOST:PORT).

    A local instance is given ``extra_pythonpath`` so that workers import the user's trainer
    module from the directory the command was run in.
    """
    import ray

    if ray.is_initialized():
        return RayConnection(address=address, started_here=False, owned=False)
    address, from_env = _resolve_address(address)
    # A cluster whose head listens on loopback (a local `ray start --head` like autotune's own
    # local instance) is joined with this node's IP as 127.0.0.1 too: Ray looks for the node's
    # raylet at the driver's node IP.
    loopback = address is None or _is_loopback(_check_reachable(address, from_env))
    kwargs = _init_kwargs(address, extra_pythonpath)
    owner = f"{os.getpid()}-{uuid.uuid4().hex}" if address is None else None
    try:
        with _marked(owner):  # inherited by everything the instance starts
            _init(address, kwargs, loopback, owner)
    except SystemExit as e:  # ray.init's own SIGTERM handler exits with the signal's number
        if e.code == signal.SIGTERM:
            Terminated.received = True
            raise Terminated() from None
        raise
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise _refused(e, address, from_env) from None
    return RayConnection(
        address=address, started_here=address is None, from_env=from_env, owner=owner
    )


def _resolve_address(address: str | None) -> tuple[str | None, bool]:
    """The address to join (None: start a local instance), and whether it came from
    ``RAY_ADDRESS``."""
    # RAY_ADDRESS, which Ray's own tools set (`ray job submit`, a `ray start` node's shell),
    # joins like --address; the flag wins when both are given.
    from_env = address is None and bool(os.environ.get("RAY_ADDRESS", "").strip())
    if from_env:
        address = os.environ["RAY_ADDRESS"].strip()
    return address, from_env


def _init_kwargs(address: str | None, extra_pythonpath: str | None) -> dict[str, Any]:
    """``ray.init``'s arguments: quiet, and for a local instance no dashboard and the
    ``extra_pythonpath`` in its workers' ``PYTHONPATH``."""
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


def _init(address: str | None, kwargs: dict[str, Any], loopback: bool, owner: str | None) -> None:
    """``ray.init``; a start that fails or is interrupted leaves no process of a local
    instance (``owner``) behind."""
    import ray

    try:
        # "local": always a new instance, even where a `ray start` cluster exists (Ray
        # would join it on address=None); --address or RAY_ADDRESS is how to join one.
        # Its node IP is 127.0.0.1, so nothing of it listens beyond loopback.
        with loopback_node_ip() if loopback else contextlib.nullcontext():
            ray.init(address=address or "local", **kwargs)
    except BaseException:  # a start that failed or was interrupted leaves nothing
        if owner is not None:
            _reap(owner)
        raise


def _refused(e: Exception, address: str | None, from_env: bool) -> ConfigError:
    """The one-line error for a Ray that would not connect, naming its first line."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return ConfigError(
        f"{_address_flag(str(address), from_env)}: Ray would not connect ({first}); if the "
        f"cluster uses token authentication, set RAY_AUTH_MODE=token and make its token "
        f"available, else start one with `ray start --head` or "
        f"{_leave(from_env)}"
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
        cpus_per_rank=cpus, ranks_per_node=per_node, trials_fit=max(1, fit(cpus)),
        nodes=len(nodes),
    )  # fmt: skip
