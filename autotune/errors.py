"""One exception hierarchy for the whole library.

``ConfigError`` is everything a user can fix by changing an argument or a file: the CLI prints
its one-line message and exits with code 2, before anything is written. ``TrialFailed`` is a
trial that ended without a measurement; the study records it as FAIL with its reason and goes
on. ``BaselineFailed`` stops a run: without the defaults measured there is nothing to compare;
``ClusterLost`` stops it when the cluster cannot hold a trial's ranks any more.
"""

from __future__ import annotations

__all__ = ["AutotuneError", "BaselineFailed", "ClusterLost", "ConfigError", "TrialFailed"]


class AutotuneError(Exception):
    """Base class of every error autotune raises on purpose."""


class ConfigError(AutotuneError, ValueError):
    """Bad user input. The message names the offending thing and the fix, on one line."""


class TrialFailed(AutotuneError):
    """A trial ended without a measurement.

    ``reason`` is a short machine-friendly tag (``crash``, ``timeout``, ``illegal``, ``nan``)
    and ``detail`` the first meaningful line of what went wrong.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class BaselineFailed(AutotuneError):
    """The baseline trial (PyTorch defaults) failed: the workload itself does not run."""


class ClusterLost(AutotuneError):
    """The Ray cluster no longer has room for one trial's ranks (a node was lost)."""
