"""The network lab: a multi-node Ray cluster on one machine, joined by a shaped link.

``autotune lab up --nodes 2 --rate 1gbit`` builds, as root:

* one network namespace per node (``atlab-0``, ``atlab-1``, ...), each with one interface
  named ``lab`` holding ``10.213.0.(i+1)/24``, and a hub namespace ``atlab-hub`` whose bridge
  joins them: a switch with one port per node;
* both ends of every node's veth pair shaped with ``tc ... tbf`` to the given rate (a
  full-duplex link of that bandwidth per node; tbf works here, netem does not);
* a Ray head in ``atlab-0`` (port 6379 on its lab address) and a Ray worker node in each
  other namespace, ``--num-cpus`` each, with ``GLOO_SOCKET_IFNAME=lab`` in their environment,
  so that every rank process they start binds gloo to the lab interface;
* the cluster's own token: made fresh for each lab (``secrets``), kept in the lab's private
  directory (``TOKEN``, mode 0600) and named by ``RAY_AUTH_TOKEN_PATH`` in the environment of
  every node and of ``lab exec``: the lab works on a machine where Ray never ran (no
  ``~/.ray/auth_token``), and uses no token of the user's;
* a check that the cluster really has every node, from inside ``atlab-0``.

Nothing in the lab can reach or be reached from any other network: the namespaces have no
route out and no interface in the host's namespace, so the lab's own addresses are the only
ones it ever uses. A failure at any step tears down everything built so far.

``autotune lab exec -- CMD`` runs CMD in the head's namespace with the cluster's address in
``RAY_ADDRESS`` (``autotune run --address auto`` joins it); ``autotune lab down`` kills every
process in the lab's namespaces and deletes them, also after a crash half-way through ``up``.

The lab keeps its record and Ray's session files in ``/tmp/atlab`` (``TEMP_DIR``), which it
creates with mode 0700 and trusts only as that: a directory of the user running the lab (root),
mode 0700, not a symlink (``check_state_dir``). Anything else there may have been put there by
someone else, to be read as the lab's record or written through: ``lab up``, ``status`` and
``exec`` refuse it in one line, ``lab down`` leaves it alone. Ray makes its own temp dir
world-writable, so it lives inside (``RAY_TEMP_DIR``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from autotune.core.errors import AutotuneError, ConfigError

__all__ = ["Lab", "LabError", "check_state_dir", "down", "exec_in", "status", "up"]

PREFIX = "atlab"
HUB = f"{PREFIX}-hub"
IFNAME = "lab"
SUBNET = "10.213.0"
RAY_PORT = 6379
#: The lab's private directory (mode 0700): its record and Ray's session files (short: Ray's
#: socket paths are length-limited).
TEMP_DIR = Path("/tmp") / PREFIX
RECORD = TEMP_DIR / "lab.json"
#: The lab cluster's token (mode 0600): Ray's token authentication for its nodes and drivers.
TOKEN = TEMP_DIR / "token"
#: Ray's temp dir, which Ray makes world-writable: inside the private one, out of others' reach.
RAY_TEMP_DIR = TEMP_DIR / "ray"
MAX_NODES = 16
#: tbf's queue: burst and latency as measured in the design notes.
TBF = ("burst", "256kb", "latency", "50ms")
_RATE = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps)$")
#: How long the worker nodes may take to appear in the cluster.
JOIN_TIMEOUT_S = 90.0


class LabError(AutotuneError):
    """A step of building the lab failed (after which it was torn down)."""


@dataclass
class Lab:
    nodes: int
    rate: str
    cpus_per_node: int

    @property
    def address(self) -> str:
        return f"{node_ip(0)}:{RAY_PORT}"


def node_ns(i: int) -> str:
    return f"{PREFIX}-{i}"


def node_ip(i: int) -> str:
    return f"{SUBNET}.{i + 1}"


def node_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of everything the lab runs: the lab interface for gloo, Ray's token
    authentication with the lab's own token (``TOKEN``; a token this process carries in
    ``RAY_AUTH_TOKEN`` would win over the file, so it is left out), no inherited Ray address."""
    drop = ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(GLOO_SOCKET_IFNAME=IFNAME, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(TOKEN))
    env.update(extra or {})
    return env


def check_host() -> None:
    """The lab needs root, ``ip`` and ``tc``: say which is missing, in one line."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise ConfigError(
            f"autotune lab: {' and '.join(missing)} not found; install iproute2 "
            f"(apt-get install iproute2)"
        )
    if os.geteuid() != 0:
        raise ConfigError("autotune lab: network namespaces need root; run it in a root shell")


def parse_rate(rate: str) -> str:
    if not _RATE.match(rate.strip().lower()):
        raise ConfigError(
            f"--rate {rate}: not a tc rate; write a number and a unit, e.g. 1gbit, 100mbit"
        )
    return rate.strip().lower()


def check_state_dir(path: Path | None = None, *, create: bool = False) -> bool:
    """Whether the lab's private directory ``path`` (default ``TEMP_DIR``) exists; with
    ``create``, it is made (mode 0700) where missing. Raises ConfigError where something else is
    there: a symlink, not a directory, another user's, or open to others."""
    path = path or TEMP_DIR
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)  # whatever the umask
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    why = None
    if stat.S_ISLNK(st.st_mode):
        why = "is a symlink"
    elif not stat.S_ISDIR(st.st_mode):
        why = "is not a directory"
    elif st.st_uid != os.geteuid():
        why = f"belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})"
    elif stat.S_IMODE(st.st_mode) != 0o700:
        why = f"has mode {stat.S_IMODE(st.st_mode):04o}, not 0700"
    if why:
        raise ConfigError(
            f"autotune lab: {path} {why}, so it is not the lab's private directory; remove it "
            f"(rm -r {path}) if nothing of yours is in it, then try again"
        )
    return True


def namespaces() -> list[str]:
    """The lab's namespaces that exist now (after a crash, possibly only some)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted(n for n in names if n == HUB or re.fullmatch(rf"{PREFIX}-\d+", n))


def _sh(
    *cmd: str, timeout: float = 60.0, env: dict[str, str] | None = None, what: str | None = None
) -> str:
    """Run one setup step; a failure is a LabError naming it (``what``, else the command) and
    the last line it printed."""
    what = what or f"`{' '.join(cmd)}`"
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise LabError(f"{what} did not finish in {timeout:.0f}s") from None
    if p.returncode != 0:
        raise LabError(f"{what} failed: {failure_line(p.stderr, p.stdout) or p.returncode}")
    return p.stdout


#: Words of a line that says what failed, in what a setup step printed.
_FAILURE_WORDS = re.compile(r"error|fail|refus|denied|not found|cannot|invalid|exception", re.I)


def failure_line(stderr: str, stdout: str) -> str:
    """The line of a failed step's output that says what failed: stderr first (Ray prints its
    error there, and a harmless "Local node IP" line last on stdout), the last line there
    naming an error, else stderr's last line, else stdout's; empty when it printed nothing."""
    for text in (stderr, stdout):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        named = [line for line in lines if _FAILURE_WORDS.search(line)]
        if named or lines:
            return (named or lines)[-1][:300]
    return ""


def _ray() -> str:
    """The ``ray`` command of the Python running autotune (its workers import autotune)."""
    sibling = Path(sys.executable).parent / "ray"
    return str(sibling) if sibling.exists() else (shutil.which("ray") or "ray")


def _in_ns(ns: str, *cmd: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *cmd]


def _build_network(lab: Lab) -> None:
    _sh("ip", "netns", "add", HUB)
    _sh("ip", "-n", HUB, "link", "add", "br0", "type", "bridge")
    _sh("ip", "-n", HUB, "link", "set", "br0", "up")
    for i in range(lab.nodes):
        ns, port = node_ns(i), f"h{i}"
        _sh("ip", "netns", "add", ns)
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh(
            "ip",
            "-n",
            HUB,
            "link",
            "add",
            port,
            "type",
            "veth",
            "peer",
            "name",
            IFNAME,
            "netns",
            ns,
        )
        _sh("ip", "-n", HUB, "link", "set", port, "master", "br0")
        _sh("ip", "-n", ns, "addr", "add", f"{node_ip(i)}/24", "dev", IFNAME)
        for where, dev in ((ns, IFNAME), (HUB, port)):  # both directions: a full-duplex link
            _sh(
                "tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", lab.rate, *TBF
            )
            _sh("ip", "-n", where, "link", "set", dev, "up")


def _make_token() -> None:
    """The lab cluster's token, fresh, in ``TOKEN`` (mode 0600, created without following a
    link: the private directory was checked just before)."""
    fd = os.open(TOKEN, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))


def _start_ray(lab: Lab) -> None:
    common = ["--num-cpus", str(lab.cpus_per_node), "--disable-usage-stats"]
    env = node_env()
    for i in range(lab.nodes):
        if i == 0:
            args = [
                "--head",
                "--port",
                str(RAY_PORT),
                "--include-dashboard=false",
                "--temp-dir",
                str(RAY_TEMP_DIR),
            ]
        else:
            args = ["--address", lab.address]
        _sh(
            *_in_ns(node_ns(i), _ray(), "start", "--node-ip-address", node_ip(i), *args, *common),
            env=env,
            timeout=180,
            what=f"ray start on node {i}",
        )


#: Run inside the head's namespace: the alive nodes' addresses, once every node has joined.
_JOINED = """
import sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
deadline = time.monotonic() + float(sys.argv[3])
while True:
    ips = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
    if len(ips) >= int(sys.argv[2]) or time.monotonic() > deadline:
        break
    time.sleep(1)
print(" ".join(ips))
"""


def _wait_joined(lab: Lab) -> list[str]:
    cmd = _in_ns(
        node_ns(0), sys.executable, "-c", _JOINED, lab.address, str(lab.nodes), str(JOIN_TIMEOUT_S)
    )
    p = subprocess.run(
        cmd, capture_output=True, text=True, env=node_env(), timeout=JOIN_TIMEOUT_S + 60
    )
    ips = p.stdout.split()
    want = [node_ip(i) for i in range(lab.nodes)]
    if p.returncode != 0 or sorted(ips) != sorted(want):
        said = failure_line(p.stderr, "")
        raise LabError(
            f"the cluster has nodes {ips or 'none'}, expected {want}"
            + (f" ({said})" if said else "")
        )
    return ips


def up(*, nodes: int = 2, rate: str = "1gbit", cpus_per_node: int | None = None) -> Lab:
    """Build the lab; on any failure tear down what was built and raise. The flags are
    checked before the host, so a mistyped flag is named where the lab could not run."""
    if not 2 <= nodes <= MAX_NODES:
        raise ConfigError(f"--nodes {nodes}: a lab has 2 to {MAX_NODES} nodes")
    rate = parse_rate(rate)
    if cpus_per_node is not None and cpus_per_node < 1:
        raise ConfigError(f"--cpus-per-node {cpus_per_node}: must be at least 1")
    check_host()
    cpus = cpus_per_node or max(1, (os.cpu_count() or 1) // nodes)
    existing = namespaces()
    if existing:
        raise ConfigError(
            f"autotune lab: a lab is already up ({', '.join(existing)}); "
            f"run `autotune lab down` first"
        )
    lab = Lab(nodes=nodes, rate=rate, cpus_per_node=cpus)
    check_state_dir(create=True)
    try:
        _build_network(lab)
        _make_token()
        _start_ray(lab)
        _wait_joined(lab)
        RECORD.write_text(json.dumps(asdict(lab)))
    except BaseException:
        down()
        raise
    return lab


def _kill_ns_processes(ns: str) -> None:
    """SIGTERM, then SIGKILL after a grace period, every process in namespace ``ns``."""

    def pids() -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        return [int(x) for x in out.stdout.split() if x.isdigit() and int(x) != os.getpid()]

    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        for pid in pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        until = time.monotonic() + wait
        while pids() and time.monotonic() < until:
            time.sleep(0.2)
        if not pids():
            break


def down() -> list[str]:
    """Kill every process of the lab and delete its namespaces; whatever exists of it."""
    gone = []
    for ns in namespaces():
        _kill_ns_processes(ns)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        gone.append(ns)
    with contextlib.suppress(ConfigError):  # not the lab's: left alone (`up` says so)
        if check_state_dir():
            shutil.rmtree(TEMP_DIR, ignore_errors=True)
    return gone


def current() -> Lab | None:
    """The lab that is up, from its record; None when there is none (or only debris)."""
    if not check_state_dir():
        return None
    try:
        return Lab(**json.loads(RECORD.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def status() -> dict[str, object]:
    """What exists of the lab: namespaces, the record, each node's address, shaping and
    process count."""
    lab = current()
    nodes = []
    names = namespaces()
    for ns in names:
        if ns == HUB:
            continue
        i = int(ns.rsplit("-", 1)[1])
        qdisc = subprocess.run(
            ["tc", "-n", ns, "qdisc", "show", "dev", IFNAME], capture_output=True, text=True
        ).stdout.strip()
        procs = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        nodes.append(
            {
                "namespace": ns,
                "address": node_ip(i),
                "qdisc": qdisc,
                "processes": len(procs.stdout.split()),
            }
        )
    return {
        "lab": None if lab is None else asdict(lab),
        "address": lab and lab.address,
        "namespaces": names,
        "nodes": nodes,
    }


def exec_in(cmd: list[str], *, node: int = 0) -> int:
    """Run ``cmd`` in node ``node``'s namespace with the lab's environment; its exit code."""
    check_host()
    lab = current()
    if lab is None or node_ns(node) not in namespaces():
        raise ConfigError("autotune lab exec: no lab is up; run `autotune lab up` first")
    if not cmd:
        raise ConfigError("autotune lab exec: no command; write autotune lab exec -- CMD ...")
    env = node_env({"RAY_ADDRESS": lab.address})
    return subprocess.call(_in_ns(node_ns(node), *cmd), env=env)
