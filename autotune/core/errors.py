"""One exception hierarchy for the whole library.

``ConfigError`` is everything a user can fix by changing an argument or a file: the CLI prints
its one-line message and exits with code 2, before anything is written. ``TrialFailed`` is a
trial that ended without a measurement; the study records it as FAIL with its reason and goes
on. ``BaselineFailed`` stops a run: without the defaults measured there is nothing to compare;
``ClusterLost`` stops it when the cluster cannot hold a trial's ranks any more.
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "AutotuneError",
    "BaselineFailed",
    "ClusterLost",
    "ConfigError",
    "FailureReason",
    "Terminated",
    "TrialFailed",
    "interrupted_by",
    "raise_terminated",
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


def raise_terminated(signum: int, frame: object) -> None:
    """The SIGTERM handler of ``autotune run``: mark SIGTERM received, raise ``Terminated``."""
    Terminated.received = True
    raise Terminated()


def interrupted_by(e: BaseException) -> str:
    """``SIGTERM`` or ``Ctrl-C``: what ``e`` (a KeyboardInterrupt) stands for."""
    return "SIGTERM" if isinstance(e, Terminated) or Terminated.received else "Ctrl-C"
