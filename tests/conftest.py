"""Shared fixtures. Integration tests share one real Ray instance per session (``ray_address``);
CLI runs join it with ``--address`` so that no test pays for a second Ray start."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
#: PYTHONPATH as the session found it; `autotune` subprocesses get this one, so a test trainer
#: is importable in the driver only when the test runs it from tests/ (cwd), as a user would.
ORIGINAL_PYTHONPATH = os.environ.get("PYTHONPATH")


#: Tiers that mostly wait (Ray's node-death timeout, a lock held past SQLite's busy timeout,
#: namespaces and a second cluster brought up): first in the queue, so that under pytest-xdist
#: the tests that keep the CPU busy run beside them.
WAITING = ("netlab", "waits", "postgres", "browser")

#: Files one pytest-xdist worker runs together, one after the other (every other file is a
#: group of its own, its module fixtures built once): the network lab's (a lab is one per
#: machine), and those that read the shared ``finished_run`` (made once, and read before the
#: one test that resumes it). ``tests/unit/test_test_groups.py`` checks that every file using
#: either is named here.
GROUPS = {
    "test_netlab.py": "netlab",
    "test_netlab_script.py": "netlab",
    "test_browser.py": "finished_run",
    "test_report_cli.py": "finished_run",
    "test_run_cli.py": "finished_run",
}


def group_of(nodeid: str) -> str:
    """The group of the test ``nodeid``: its file's entry in ``GROUPS``, else its file."""
    path = nodeid.split("::", 1)[0]
    return GROUPS.get(Path(path).name, path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``-n``: whole groups (``group_of``) to a worker, in the order of the collection.
    pytest-xdist's own ``--dist loadgroup`` cannot do it here: it renames a test's node id to
    carry its ``xdist_group`` mark, which pytest 9 ignores (a node's id is no longer that
    attribute), so every test went to any worker. This is pytest-xdist's way of making its
    ``loadfile`` scheduler, with the group in place of the file."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The waiting tiers first and the unit tier last (a stable sort: each file's own order
    kept; the queue of groups under ``-n``), and the ``stress`` tier (a hostile case repeated
    tens of times) run only where asked."""

    def rank(item: pytest.Item) -> int:
        if any(item.get_closest_marker(m) for m in WAITING):
            return 0
        return 1 if item.get_closest_marker("integration") else 2

    items.sort(key=rank)
    if os.environ.get("AUTOTUNE_STRESS") == "1":
        return
    skip = pytest.mark.skip(
        reason="stress tier: repeats a case many times; AUTOTUNE_STRESS=1 runs it"
    )
    for item in items:
        if "stress" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """What torch computes in the test process itself (the built-in trainers' steps in
    ``test_trainers.py``, the Gaussian process of Optuna's terminator behind the search's
    convergence stop, the GP sampler) runs on one thread: these are tiny tensors, and on a
    shared 2-core machine two threads made ten long replays take twice as long. Rank processes
    set their own (a trial's ``threads``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def ray_address():
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        # Rank processes import the test trainers from tests/: those of this process's jobs
        # through the runtime env, those of `autotune --address` drivers through the raylet's
        # environment, which every worker inherits.
        # (no empty entry: one would put every subprocess's current directory on its path)
        pythonpath = os.pathsep.join(
            p for p in (str(REPO / "tests"), os.environ.get("PYTHONPATH", "")) if p
        )
        os.environ["PYTHONPATH"] = pythonpath
        from autotune.core.compat import loopback_node_ip

        with loopback_node_ip():  # like the local instance `autotune run` starts
            ray.init(
                num_cpus=2,
                include_dashboard=False,
                log_to_driver=False,
                logging_level="WARNING",
                runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
            )
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture
def run_env(tmp_path):
    """Environment for `autotune` subprocesses: run outputs in a fresh temporary directory."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if ORIGINAL_PYTHONPATH is not None:
        env["PYTHONPATH"] = ORIGINAL_PYTHONPATH
    env["AUTOTUNE_HOME"] = str(tmp_path / "home")
    env["PYTHONUNBUFFERED"] = "1"
    return env


#: The installed console script, as a user types `autotune`: unlike ``python -m
#: autotune.cli.main`` it puts nothing (the current directory) on ``sys.path``.
AUTOTUNE = str(Path(sys.executable).with_name("autotune"))


def edited(record: dict, **changes) -> dict:
    """A deep copy of a probe ``record`` with ``changes``: ``section__key=value`` sets one
    key of a section, ``key=value`` a whole entry."""
    import copy

    r = copy.deepcopy(record)
    for path, value in changes.items():
        section, _, key = path.partition("__")
        if key:
            r[section][key] = value
        else:
            r[section] = value
    return r


def autotune_cmd(*args: str) -> list[str]:
    return [AUTOTUNE, *args]


def with_env(name: str, value_prefix: str) -> set[int]:
    """The live processes whose environment (as they were started) sets ``name`` to a value
    starting with ``value_prefix``: what a test started, and what that started, found by a
    mark of its own, whatever else runs on the machine (another worker's tests included)."""
    from autotune.launch.reaper import read_proc

    needle = f"{name}={value_prefix}".encode()
    out = set()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(v.startswith(needle) for v in env):
            p = read_proc(int(entry.name))
            if p is not None and not p.zombie:
                out.add(p.pid)
    return out


def wait_for(predicate: Callable[[], object], timeout: float, every: float = 0.1) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass; whether it holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return bool(predicate())


@dataclass
class Ran:
    """What one ``autotune`` command did: its exit code, stdout and stderr."""

    returncode: int
    stdout: str
    stderr: str


class _Refused(BaseException):
    """Raised by what an in-process ``autotune`` command must never reach (a BaseException,
    so that no ``except Exception`` in the command turns it into an error message)."""


def _refuse(what: str) -> Callable[..., None]:
    def refused(*args, **kwargs) -> None:
        raise _Refused(f"the in-process command reached {what}: bad input must stop before it")

    return refused


def in_process(
    *args: str, cwd: Path | str | None = None, env: Mapping[str, str] | None = None
) -> Ran:
    """``autotune ARGS`` run in this process through ``autotune.cli.main.main(argv)``, as the
    console script runs it (exit code, stdout, stderr), in a fraction of a second instead of a
    new interpreter's import of torch, Ray and Optuna. For bad input, which must stop before any
    side effect: starting Ray, exec'ing a command or serving the dashboard fails the test. The
    command sees no Ray connection, as a fresh process would, even where the session's
    integration tests left this process connected to theirs (``ray_address``).

    Nothing of the process is left changed: the environment is the session's with ``RAY_*`` and
    ``AUTOTUNE_*`` taken out and ``env`` added, for this call only; the working directory,
    ``sys.path`` (a ``module:function`` trainer puts the working directory on it), the modules
    imported from ``cwd``, ``tempfile``'s directory (it follows ``TMPDIR`` in ``env``), the
    SIGINT/SIGTERM handlers, the root logger's handlers and Optuna's verbosity are restored
    after it. Warnings and log records at WARNING or above reach stderr as a fresh process would
    print them (pytest would otherwise collect them), so "one line on stderr" means the same
    here as through the console script."""
    import contextlib
    import io
    import logging
    import signal
    import tempfile
    import warnings

    import optuna
    import optuna_dashboard
    import ray

    from autotune.cli import dashboard as dashboard_gate
    from autotune.cli import main as cli_main

    out, err = io.StringIO(), io.StringIO()
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_path = list(sys.path)
    saved_modules = set(sys.modules)
    saved_tempdir = tempfile.tempdir
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    saved_handlers = list(logging.root.handlers)
    saved_verbosity = optuna.logging.get_verbosity()
    saved_bytecode = sys.dont_write_bytecode
    guarded = [
        (ray, "init"),
        (os, "execvpe"),
        (os, "execvp"),
        (os, "execve"),
        (os, "execv"),
        (optuna_dashboard, "run_server"),
        (dashboard_gate, "serve"),
    ]
    originals = [
        (obj, name, getattr(obj, name)) for obj, name in [*guarded, (ray, "is_initialized")]
    ]
    stderr_log = logging.StreamHandler(err)
    stderr_log.setLevel(logging.WARNING)
    try:
        for k in [k for k in os.environ if k.startswith(("RAY_", "AUTOTUNE_"))]:
            del os.environ[k]
        os.environ.update(env or {})
        if "TMPDIR" in (env or {}):
            tempfile.tempdir = None  # gettempdir() reads TMPDIR again
        if cwd is not None:
            os.chdir(cwd)
        sys.dont_write_bytecode = True  # a user's trainer module imported from cwd: no .pyc
        for obj, name in guarded:
            setattr(obj, name, _refuse(f"{getattr(obj, '__name__', obj)}.{name}"))
        ray.is_initialized = lambda: False  # a fresh process: not connected to any cluster
        logging.root.addHandler(stderr_log)

        def show(message, category, filename, lineno, file=None, line=None) -> None:
            sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            warnings.resetwarnings()  # Python's own defaults, not pytest's collection
            for quiet in (
                DeprecationWarning,
                PendingDeprecationWarning,
                ImportWarning,
                ResourceWarning,
            ):
                warnings.simplefilter("ignore", quiet)
            warnings.showwarning = show
            try:
                code = cli_main.main(list(args))
            except SystemExit as e:  # argparse: usage errors, --help, --version
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        logging.root.handlers[:] = saved_handlers
        for obj, name, original in originals:
            setattr(obj, name, original)
        sys.dont_write_bytecode = saved_bytecode
        optuna.logging.set_verbosity(saved_verbosity)
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
        tempfile.tempdir = saved_tempdir
        os.chdir(saved_cwd)
        sys.path[:] = saved_path
        here = [Path(p).resolve() for p in (cwd, (env or {}).get("TMPDIR")) if p]
        for name in set(sys.modules) - saved_modules:
            file = getattr(sys.modules[name], "__file__", None)
            if file and any(d in Path(file).resolve().parents for d in here):
                del sys.modules[name]
        for k in set(os.environ) - set(saved_env):
            del os.environ[k]
        for k, v in saved_env.items():
            if os.environ.get(k) != v:
                os.environ[k] = v
    return Ran(code, out.getvalue(), err.getvalue())


@pytest.fixture
def cli(tmp_path):
    """``in_process`` with ``AUTOTUNE_HOME`` in the test's temporary directory (``env`` may
    override it)."""

    def run(*args: str, cwd=None, env: Mapping[str, str] | None = None) -> Ran:
        return in_process(
            *args, cwd=cwd, env={"AUTOTUNE_HOME": str(tmp_path / "home"), **(env or {})}
        )

    return run


def console_script(
    *args: str,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> Ran:
    """``autotune ARGS`` through the installed console script, in a new process: the
    environment is the session's with ``RAY_*`` and ``AUTOTUNE_*`` taken out and ``env``
    added (like ``in_process``), and no ``.pyc`` written for a trainer module imported from
    ``cwd`` (Python's cache, not autotune's output: "nothing written" is about the latter)."""
    import subprocess

    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AUTOTUNE_"))}
    clean["PYTHONDONTWRITEBYTECODE"] = "1"
    p = subprocess.run(
        autotune_cmd(*args),
        cwd=cwd,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Ran(p.returncode, p.stdout, p.stderr)


def started_run(env, *args: str, cwd=None, after_trials: int = 1):
    """Start ``autotune run ...`` with Ctrl-C deliverable (a background shell would ignore
    it) and return once ``after_trials`` trials have printed their result."""
    import signal
    import subprocess

    p = subprocess.Popen(
        autotune_cmd("run", *args),
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen = 0
    for line in p.stdout:
        seen += "samples/s" in line
        if seen >= after_trials:
            break
    return p
