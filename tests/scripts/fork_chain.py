"""A hostile script for the containment tests: it starts two chains of processes in which
each link forks the next and exits every few milliseconds, and keeps doing so; the second
chain also calls ``setsid`` at every link, so that no process group or session holds it.
Every process ignores SIGTERM. The script itself then sleeps, or with ``--exit`` exits at
once and leaves the chains running.

``python fork_chain.py STOP_FILE [--exit] [--period-ms N] [--lifetime-s N]``

A link lives a few milliseconds: a scan of ``/proc`` can miss a live chain. So each link
writes its pid to ``STOP_FILE.beat-<chain>`` (``beat-0``, ``beat-1``): a chain is alive while
that file changes. ``STOP_FILE`` is in every process's command line (for a ``/proc`` scan),
and stops them: a link that sees it exists exits without forking. That and ``--lifetime-s``
(600 by default) are a safety net for the machine that runs the tests; the thing tested never
creates the file.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def chain(stop: str, which: int, period_s: float, until: float) -> None:
    """Be one link after another: sleep ``period_s``, fork the next link, exit."""
    beat = f"{stop}.beat-{which}"
    while not os.path.exists(stop) and time.monotonic() < until:
        time.sleep(period_s)
        try:
            pid = os.fork()
        except OSError:  # out of processes for a moment: try again
            continue
        if pid:
            os._exit(0)
        if which == 1:
            os.setsid()
        fd = os.open(beat, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
    os._exit(0)


def main(argv: list[str]) -> None:
    stop = argv[0]
    period_ms = float(argv[argv.index("--period-ms") + 1]) if "--period-ms" in argv else 2.0
    lifetime = float(argv[argv.index("--lifetime-s") + 1]) if "--lifetime-s" in argv else 600.0
    until = time.monotonic() + lifetime
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for which in (0, 1):
        if os.fork() == 0:
            chain(stop, which, period_ms / 1000, until)
    print("fork_chain: two chains started", flush=True)
    if "--exit" in argv:
        return
    while not os.path.exists(stop) and time.monotonic() < until:
        time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[1:])
