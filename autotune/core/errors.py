"""One exception hierarchy for the whole library.

``ConfigError`` is everything a user can fix by changing an argument or a file: the CLI prints
its one-line message and exits with code 2, before anything is written. ``TrialFailed`` is a
trial that ended without a measurement; the study records it as FAIL with its reason and goes
on. ``BaselineFailed`` stops a run: without the defaults measured there is nothing to compare;
``ClusterLost`` stops it when the cluster cannot hold a trial's ranks any more.

``Terminated`` and the handlers below are how ``autotune run`` stops on SIGTERM: the first
SIGTERM raises, later ones and those that arrive where nothing may be cut short (Ray starting,
the export, the shutdown) are recorded, and the run ends as terminated once that part is done.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Generic, TypeVar

__all__ = [
    "AutotuneError",
    "BaselineFailed",
    "ClusterLost",
    "ConfigError",
    "FailureReason",
    "Kept",
    "Terminated",
    "TrialFailed",
    "interrupted_by",
    "note_terminated",
    "raise_terminated",
    "signals_held",
]


class AutotuneError(Exception):
    """Base class of every error autotune raises on purpose."""


class ConfigError(AutotuneError, ValueError):
    """Bad user input. The message names the offending thing and the fix, on one line."""


class FailureReason(str, Enum):
    """Why a trial ended without a measurement (the trial's ``reason`` attribute)."""

    CRASH = "crash"
    """A rank raised an error of its own, or its process died."""
    TIMEOUT = "timeout"
    """No result before the trial's deadline (a hung collective, a stuck rank)."""
    OOM = "oom"
    """Out of memory: host (``--max-memory``, MemoryError) or CUDA."""
    NAN = "nan"
    """The loss became NaN or infinite."""
    ILLEGAL = "illegal"
    """The configuration breaks a rule known before anything runs (e.g. NCCL's thread cap)."""
    NUMERICS_DRIFT = "numerics_drift"
    """The loss drifted from the fp32 baseline's beyond the tolerance."""
    NODE_LOST = "node_lost"
    """A node of the trial's ranks left the cluster."""
    INTERRUPTED = "interrupted"
    """Ctrl-C, or the driver running the trial died."""
    CLUSTER_LOST = "cluster_lost"
    """The cluster has no room for the trial's ranks any more."""
    KNOWN_FAILING = "known_failing"
    """Not run: one of its values failed in every earlier trial with it
    (``search.failing``)."""

    def __str__(self) -> str:
        return self.value

    @property
    def learned(self) -> bool:
        """Whether the failure says something about the configuration, so the sampler should
        move away from it (a lost node or Ctrl-C says nothing about it)."""
        return self in _LEARNED


_LEARNED = frozenset(
    {
        FailureReason.CRASH,
        FailureReason.TIMEOUT,
        FailureReason.OOM,
        FailureReason.NAN,
        FailureReason.ILLEGAL,
        FailureReason.NUMERICS_DRIFT,
        FailureReason.KNOWN_FAILING,
    }
)


class TrialFailed(AutotuneError):
    """A trial ended without a measurement.

    ``reason`` is a ``FailureReason`` (a ``str`` enum, so it compares and
    stores as its tag: ``crash``, ``timeout``, ``illegal``, ``nan``...) and ``detail`` the first
    meaningful line of what went wrong.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = FailureReason(reason)
        self.detail = detail
        super().__init__(f"{self.reason}: {detail}" if detail else str(self.reason))

    def __reduce__(self) -> tuple[type[TrialFailed], tuple[str, str]]:
        """Pickled as its reason and detail (its args are the formatted message): a trial that
        fails inside a Ray task (script mode) reaches the driver as itself, not as Ray's
        "Failed to deserialize exception"."""
        return type(self), (self.reason.value, self.detail)


class BaselineFailed(AutotuneError):
    """The baseline trial (PyTorch defaults) failed: the workload itself does not run."""


class ClusterLost(AutotuneError):
    """The Ray cluster no longer has room for one trial's ranks (a node was lost)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's preemption, ``timeout``, ``docker stop``): handled like Ctrl-C -
    the running trial is recorded ``interrupted`` and the best profile so far exported."""

    #: Set by autotune's SIGTERM handler before it raises: an exception raised by a signal
    #: handler inside ``ray.get``/``ray.wait`` reaches the caller as a plain KeyboardInterrupt
    #: (seen in CI), so the type alone can lose which signal it was.
    received = False


class InterruptedAgain(KeyboardInterrupt):
    """A Ctrl-C (or a first SIGTERM) that arrived while an earlier one was still stopping the
    running trials: the run exits at once, as on a second Ctrl-C at any later point."""


def _received() -> bool:
    """Record a SIGTERM; whether one was recorded before. Also cancels the alarm that Ray's
    failure signal handler (absl's, installed by Ray's core worker, which passes the SIGTERM
    on to this handler) arms as it sees a SIGTERM: its SIGALRM handler aborts the process 3 s
    later, wherever the stop has got to (SIGABRT instead of exit 143). autotune sets no alarm
    of its own."""
    signal.alarm(0)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    before, Terminated.received = Terminated.received, True
    return before


def raise_terminated(signum: int, frame: object) -> None:
    """The SIGTERM handler of ``autotune run``: the first SIGTERM raises ``Terminated``; one
    that arrives while the run is already stopping is only recorded, so that the stop itself
    (the running trial recorded, the profile exported, Ray shut down) is not cut short."""
    if not _received():
        raise Terminated()


def note_terminated(signum: int, frame: object) -> None:
    """The SIGTERM handler where nothing may be cut short (the export, Ray's shutdown):
    recorded in ``Terminated.received``; the run ends as terminated after that part."""
    _received()


@contextlib.contextmanager
def signals_held() -> Iterator[list[str]]:
    """SIGTERM and Ctrl-C recorded, not raised, while inside (call from the main thread): the
    list it yields receives what arrived, as ``interrupted_by`` names it."""
    got: list[str] = []

    def note(signum: int, frame: object) -> None:
        got.append("SIGTERM" if signum == signal.SIGTERM else "Ctrl-C")
        if signum == signal.SIGTERM:
            _received()

    before = {s: signal.signal(s, note) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield got
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


T = TypeVar("T")


class Kept(Generic[T]):
    """``start()`` run on a thread of its own that lives until ``close()`` runs ``stop(value)``
    there, while the main thread waits for ``start`` with SIGTERM and Ctrl-C held
    (``signals_held``): what ``start`` builds cannot be left half-built by a signal handler
    raising in the middle of it, and lives as long as the thread that built it (a process
    started from a thread gets its parent-death signal when that thread ends). A signal that
    arrived meanwhile is raised once ``stop`` has run: ``Terminated`` or KeyboardInterrupt."""

    value: T
    """What ``start`` returned."""

    def __init__(self, start: Callable[[], T], stop: Callable[[T], object], name: str) -> None:
        self._error: BaseException | None = None
        self._stop = stop
        self._ready, self._release, self._done = (threading.Event() for _ in range(3))
        self._thread = threading.Thread(target=self._keep, args=(start,), name=name, daemon=True)
        with signals_held() as got:
            self._thread.start()
            while not self._ready.wait(0.1):
                pass
        if got:
            self.close()
            raise Terminated() if "SIGTERM" in got else KeyboardInterrupt()
        if self._error is not None:
            raise self._error

    def _keep(self, start: Callable[[], T]) -> None:
        try:
            value = start()
        except BaseException as e:  # noqa: BLE001 - raised again in the main thread
            self._error = e
            self._ready.set()
            return
        self.value = value
        self._ready.set()
        self._release.wait()
        try:
            self._stop(value)
        except BaseException as e:  # noqa: BLE001 - raised again by close()
            self._error = e
        finally:
            self._done.set()

    def close(self) -> None:
        """Run ``stop`` on the keeping thread and wait for it; its error is raised here. (The
        wait is on an event, not ``Thread.join``, which Ctrl-C can leave inconsistent.)"""
        if self._error is None and not self._release.is_set():
            self._release.set()
            while not self._done.wait(0.1):
                pass
            if self._error is not None:
                raise self._error


def interrupted_by(e: BaseException) -> str:
    """``SIGTERM`` or ``Ctrl-C``: what ``e`` (a KeyboardInterrupt) stands for."""
    return "SIGTERM" if isinstance(e, Terminated) or Terminated.received else "Ctrl-C"
