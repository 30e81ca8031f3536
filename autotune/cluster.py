"""Ray as the run sees it: start a local instance or join a cluster, and plan how one trial's
ranks sit on its nodes.

* ``connect(address)`` starts a local Ray instance (``address=None`` and no ``RAY_ADDRESS``)
  or joins an existing cluster (``auto`` or ``HOST:PORT``, from the flag or ``RAY_ADDRESS``),
  failing in seconds with a one-line error when nothing
  answers there. A local instance's node IP is 127.0.0.1: all its servers listen on loopback
  only (``_compat.loopback_node_ip``), and so do the ranks' rendezvous and gloo (``pool``). A
  cluster's nodes keep the address they were started with.
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
import socket
from dataclasses import dataclass
from typing import Any

from autotune._compat import bootstrap_address, loopback_node_ip
from autotune.errors import ConfigError

__all__ = ["RankPlan", "RayConnection", "connect", "plan_ranks", "rank_plan"]

#: Seconds to wait for a TCP answer from a given cluster address before giving up.
REACH_TIMEOUT_S = 5.0


@dataclass
class RayConnection:
    address: str | None
    started_here: bool
    owned: bool = True
    """False when Ray was already initialised by the caller (library use): left as found."""
    from_env: bool = False
    """The address came from ``RAY_ADDRESS``, not ``--address``."""

    def describe(self) -> str | None:
        """The line a run prints about a cluster it joined; None for a local instance."""
        if self.address is None or not self.owned:
            return None
        return f"Joined the Ray cluster at {self.address}" + (
            " (RAY_ADDRESS)" if self.from_env else ""
        )

    def close(self) -> None:
        import ray

        if self.owned and ray.is_initialized():
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
    # RAY_ADDRESS, which Ray's own tools set (`ray job submit`, a `ray start` node's shell),
    # joins like --address; the flag wins when both are given.
    from_env = address is None and bool(os.environ.get("RAY_ADDRESS", "").strip())
    if from_env:
        address = os.environ["RAY_ADDRESS"].strip()
    # A cluster whose head listens on loopback (a local `ray start --head` like autotune's own
    # local instance) is joined with this node's IP as 127.0.0.1 too: Ray looks for the node's
    # raylet at the driver's node IP.
    loopback = address is None or _is_loopback(_check_reachable(address, from_env))
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
        # "local": always a new instance, even where a `ray start` cluster exists (Ray would
        # join it on address=None); --address or RAY_ADDRESS is how to join one. Its node IP
        # is 127.0.0.1, so nothing of it listens beyond loopback.
        with loopback_node_ip() if loopback else contextlib.nullcontext():
            ray.init(address=address or "local", **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(
            f"{_address_flag(str(address), from_env)}: Ray would not connect ({first}); if the "
            f"cluster uses token authentication, set RAY_AUTH_MODE=token and make its token "
            f"available, else start one with `ray start --head` or "
            f"{_leave(from_env)}"
        ) from None
    return RayConnection(address=address, started_here=address is None, from_env=from_env)


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
