"""Why a trial failed: the classifiers that turn what a rank raised (gloo, Ray, CUDA errors)
into a ``FailureReason`` (defined with ``TrialFailed`` in ``autotune.core.errors``).

The classifiers are pure functions over exception objects and error text; they know the
wording of the errors they read, and ``tests/unit/test_failures.py`` holds captured examples of
each. ``launcher`` calls them on what the ranks raised; ``objective`` records the result on the
trial (``record.study.record_failure``); ``samplers`` shows the sampler the failures whose
reason is about the configuration (``FailureReason.learned``).
"""

from __future__ import annotations

import re

from autotune.core.errors import FailureReason, TrialFailed

__all__ = [
    "FailureReason",
    "classify",
    "death_line",
    "first_line",
    "gone_away",
    "last_words",
    "learned_reasons",
]


def learned_reasons() -> frozenset[str]:
    """The reasons (as stored on trials) that the sampler learns from."""
    return frozenset(r.value for r in FailureReason if r.learned)


#: What a surviving rank says when its peer's process or node is gone (gloo, Ray).
PEER_LOSS = (
    "connection closed by peer",
    "connection reset",
    "broken pipe",
    "socket closed",
    # torch's TCPStore client when the store's host is gone (seen when a lab node was killed)
    "connection was likely closed",
)


def first_line(text: str) -> str:
    """The first meaningful line of an error text: not a traceback header, not blank."""
    for line in str(text).splitlines():
        line = line.strip()
        if line and not line.startswith(("Traceback", "File ", "^", "ray::")):
            return line[:300]
    return str(text).strip()[:300]


def death_line(text: str) -> str:
    """Why Ray says an actor died: the line after its generic first line and tab-indented
    details (``The actor is dead because its worker process has died...``)."""
    lines = [line for line in text.splitlines() if line.strip()]
    for line in lines[1:]:
        if not line.startswith("\t"):
            return line.strip()[:300]
    return first_line(text)


#: Lines a dying process's crash handlers write (Ray's and Abseil's signal handlers, Python's
#: faulthandler dump of the stack and of the modules loaded), not what went wrong.
_HANDLER_LINE = re.compile(
    r"^(\*\*\* SIG|PC: @|@ |\[failure_signal_handler|\[\d{4}-\d\d-\d\d .*logging\.cc|"
    r"Stack \(most recent|Current thread|Thread 0x|File \"|Extension modules:|\(total: )"
)
#: A line that says what killed a process: glibc's ``function(): what`` (``malloc(): unaligned
#: tcache chunk detected``, ``free(): invalid pointer``), a C++ ``terminate`` and its
#: ``what()``, Python's ``Fatal Python error: ...``, an error or exception named.
_FATAL = re.compile(
    r"^[\w.]+\(\): |corrupt|double free|terminate called|what\(\)|error|exception|abort|"
    r"fault|killed",
    re.I,
)


def last_words(text: str, most: int = 2) -> str:
    """What a process whose death Ray reports wrote of why, from the end of its output
    ``text``: its last ``most`` distinct lines that say what killed it (``_FATAL``), in the
    order they first appear, crash handlers' lines left out; "" where none does (a process
    killed outright, by the OOM killer or ``kill -9``, writes nothing)."""
    said: list[str] = []
    for line in text.splitlines():
        line = line.strip()[:200]
        if line and not _HANDLER_LINE.search(line) and _FATAL.search(line) and line not in said:
            said.append(line)
    return "; ".join(said[-most:])


def gone_away(f: TrialFailed) -> bool:
    """A failure that only says a peer or a rank's process went away (the symptom of a lost
    node, or of a process killed outright), not what a rank's own code raised."""
    text = f.detail.lower()
    return "its process died" in text or any(t in text for t in PEER_LOSS)


def classify(rank: int, err: BaseException) -> TrialFailed:
    """The failure of ``rank`` that raised ``err`` (a Ray error wrapping the rank's own, or a
    Ray error saying the actor died)."""
    import ray.exceptions as rex

    from autotune.core.rank_io import NonFiniteLoss

    cause = getattr(err, "cause", None) or err
    if isinstance(err, rex.RayActorError) and not isinstance(err, rex.RayTaskError):
        why = death_line(str(err))
        if "node" in why.lower() and ("died" in why or "dead" in why):
            return TrialFailed(FailureReason.NODE_LOST, f"rank {rank}: its node was lost ({why})")
        return TrialFailed(FailureReason.CRASH, f"rank {rank}: its process died ({why})")
    if isinstance(cause, NonFiniteLoss):
        return TrialFailed(FailureReason.NAN, f"rank {rank}: {cause}")
    return classify_text(
        rank, type(cause).__name__, str(cause), memory=isinstance(cause, MemoryError)
    )


def classify_text(rank: int, kind: str, message: str, *, memory: bool = False) -> TrialFailed:
    """The failure of a rank that raised an exception of type ``kind`` with ``message``:
    ``oom`` for memory errors (host or CUDA), else ``crash`` with the first meaningful line."""
    text = f"{kind}: {first_line(message)}"
    if memory or "OutOfMemoryError" in text or "out of memory" in text:
        return TrialFailed(FailureReason.OOM, f"rank {rank}: {text}")
    return TrialFailed(FailureReason.CRASH, f"rank {rank}: {text}")
