"""The Ray address a run joins, checked before anything starts: ``--address``, else
``RAY_ADDRESS`` (which Ray's own tools set: ``ray job submit``, a ``ray start`` node's shell),
the flag winning when both are given.

* ``check_address`` refuses the two forms people hold that join no cluster: Ray Client's
  ``ray://HOST:10001`` and the dashboard's ``http://HOST:8265``. Ray Client runs the driver off
  the cluster, behind the client's proxy; autotune's driver places the ranks, watches their
  nodes and records its own identity for the trials it runs (a dead driver's trials are closed
  by the next run on its machine), all of which assumes it runs on a node of the cluster:
  unsupported and untested. The dashboard's address is ``ray job submit``'s, no cluster to
  join. Each error names the GCS address to use instead, and the job form.
* ``check_reachable`` fails in seconds where ``ray.init`` would retry for minutes: nothing
  answers at ``HOST:PORT``.
* ``auth_as_ray_would`` makes Ray's own choice of token authentication for ``auto``
  explicit, so that Ray does not warn that it made it.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import socket
from pathlib import Path

from autotune.core.compat import bootstrap_address, reread_ray_config
from autotune.core.errors import ConfigError

__all__ = ["auth_as_ray_would", "check_address", "check_reachable", "flag_of", "is_loopback"]
__all__ += ["leave_hint", "resolve"]

#: Seconds to wait for a TCP answer from a given cluster address before giving up.
REACH_TIMEOUT_S = 5.0


def flag_of(address: str, from_env: bool) -> str:
    """How an error names the address: the flag, or the variable it came from."""
    return f"RAY_ADDRESS={address}" if from_env else f"--address {address}"


def leave_hint(from_env: bool) -> str:
    """How an error says to start a local instance instead."""
    return "unset RAY_ADDRESS" if from_env else "leave --address out"


def check_address(address: str | None) -> None:
    """Raise ConfigError, before anything starts, for an address (``address``, else
    ``RAY_ADDRESS``) of a form no cluster is joined by: Ray Client's ``ray://`` and the
    dashboard's ``http(s)://``, each error naming the GCS address to use instead."""
    address, from_env = resolve(address)
    if address is None or "://" not in address:
        return
    name = flag_of(address, from_env)
    scheme, _, rest = address.partition("://")
    host = rest.split("/", 1)[0].rpartition(":")[0] or rest.split("/", 1)[0] or "HOST"
    use = f"RAY_ADDRESS={host}:6379" if from_env else f"--address {host}:6379"
    if scheme.lower() == "ray":
        raise ConfigError(
            f"{name}: Ray Client is not supported (autotune's driver places and watches the "
            f"ranks from a node of the cluster); run autotune on a node with the cluster's GCS "
            f"address ({use}) or --address auto, or submit it as a job: ray job submit "
            f"--address http://{host}:8265 -- autotune run ..."
        )
    if scheme.lower() in ("http", "https"):
        raise ConfigError(
            f"{name}: that is the Ray dashboard's address (for `ray job submit`), not the "
            f"cluster's; use its GCS address ({use}), or --address auto on a node of the "
            f"cluster, or submit autotune as a job: ray job submit --address {address} -- "
            f"autotune run ... (the job gets RAY_ADDRESS)"
        )
    raise ConfigError(
        f"{name}: expected auto or HOST:PORT, the cluster's GCS address (e.g. "
        f"127.0.0.1:6379); {leave_hint(from_env)} to start a local instance"
    )


def check_reachable(address: str, from_env: bool = False) -> str:
    """Fail fast where ray.init would retry for minutes: nothing answers at HOST:PORT. Returns
    the host that answered."""
    name = flag_of(address, from_env)
    leave = leave_hint(from_env)
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


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def resolve(address: str | None) -> tuple[str | None, bool]:
    """The address to join (None: start a local instance), and whether it came from
    ``RAY_ADDRESS``."""
    # RAY_ADDRESS, which Ray's own tools set (`ray job submit`, a `ray start` node's shell),
    # joins like --address; the flag wins when both are given.
    from_env = address is None and bool(os.environ.get("RAY_ADDRESS", "").strip())
    if from_env:
        address = os.environ["RAY_ADDRESS"].strip()
    return address, from_env


def auth_as_ray_would() -> None:
    """``--address auto`` with RAY_AUTH_MODE unset: Ray turns token authentication on when a
    token is at hand (``RAY_AUTH_TOKEN``, the file at ``RAY_AUTH_TOKEN_PATH`` or
    ``~/.ray/auth_token``), and warns that it did. The same choice, made explicitly."""
    if os.environ.get("RAY_AUTH_MODE") is not None:
        return
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if os.environ.get("RAY_AUTH_TOKEN", "").strip() or os.path.isfile(path):
        os.environ["RAY_AUTH_MODE"] = "token"
        reread_ray_config()


def gcs_owners(proc: Path = Path("/proc")) -> set[int]:
    """The uids of the Ray clusters' GCS servers running on this machine (what ``auto`` finds:
    Ray looks for a ``gcs_server`` process), read from ``proc``."""
    owners = set()
    for entry in proc.glob("[0-9]*"):
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if not cmdline.split(b"\0", 1)[0].endswith(b"gcs_server"):
                continue
            status = (entry / "status").read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        uid = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("Uid:")), None)
        if uid is not None and uid.isdigit():
            owners.add(int(uid))
    return owners


def check_auto_owner(from_env: bool, proc: Path = Path("/proc")) -> None:
    """``auto`` joins a cluster of this user's only: Ray's ``auto`` joins whichever cluster
    runs on the machine (the newest, where several do), and the driver then unpickles what
    that cluster's workers return. Raises ``ConfigError`` naming the owner when another
    user's cluster runs here, alone or beside one of this user's: ``auto`` cannot be told
    which it joins then, and the user's own cluster is joined by its address."""
    others = gcs_owners(proc) - {os.geteuid()}
    if others:
        uid = min(others)
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = f"uid {uid}"
        raise ConfigError(
            f"{flag_of('auto', from_env)}: a Ray cluster running here belongs to {name} "
            f"(uid {uid}), not to you, and auto may join it; give your own cluster's address "
            f"(HOST:PORT of its head), or {leave_hint(from_env)} for a local instance of your own"
        )
