"""One grammar for every ``autotune`` command: ``--study`` is a study definition and
``--study-name`` a study's name wherever they appear, ``-o/--output`` is every file or
directory a command writes, and a bare command prints its help.

A renamed flag keeps its old spelling for a release (``Renamed``): the old spelling still works
and says so in one line on stderr.

| old spelling | new spelling | where |
| --- | --- | --- |
| ``--profile FILE`` | ``-o/--output FILE`` | ``run`` |
| ``--study NAME`` | ``--study-name NAME`` | ``report``, ``dashboard`` |
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["RENAMED", "Renamed", "add_output", "add_study_source", "print_help_of"]

#: Old spelling -> new spelling, for every flag renamed in this release (kept a release more).
RENAMED = {"--profile": "-o/--output", "--study": "--study-name"}
#: The help of --storage wherever a command reads a study.
STORAGE_HELP = "Optuna RDB URL (default: sqlite:///RUN_DIR/autotune.db)"
RUN_DIR_HELP = "the run directory the database is in (default: $AUTOTUNE_HOME or ~/.autotune)"


class Renamed(argparse.Action):
    """A flag stored as given (argparse's ``store``) whose ``old`` spellings, among its option
    strings, still work for a release: one used prints one deprecation line on stderr."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, *, old: Sequence[str] = (), **kw: Any
    ) -> None:
        self.old = tuple(old)
        super().__init__(option_strings, dest, **kw)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if option_string in self.old:
            print(
                f"autotune: deprecated: {option_string} is now {RENAMED[option_string]}; the "
                f"old spelling goes in the next release",
                file=sys.stderr,
            )
        setattr(namespace, self.dest, values)


def add_output(p: Any, what: str, *, old: Sequence[str] = ()) -> None:
    """``-o/--output PATH`` (and ``old`` spellings of it): where the command writes."""
    deprecated = "".join(f"; {o} is its old spelling, deprecated" for o in old)
    p.add_argument(
        "-o",
        "--output",
        *old,
        dest="output",
        type=Path,
        metavar="PATH",
        action=Renamed,
        old=old,
        help=f"{what}{deprecated}",
    )


def add_study_source(p: argparse.ArgumentParser, study_help: str) -> None:
    """``--study-name`` (and its old spelling ``--study``), ``--storage`` and ``--run-dir``:
    which stored study a command reads, and where."""
    p.add_argument(
        "--study-name",
        "--study",
        dest="study_name",
        metavar="NAME",
        action=Renamed,
        old=("--study",),
        help=f"{study_help}; --study is its old spelling here, deprecated (--study names a "
        f"study definition, in run)",
    )
    p.add_argument("--storage", metavar="URL", help=STORAGE_HELP)
    p.add_argument("--run-dir", type=Path, metavar="DIR", help=RUN_DIR_HELP)


def print_help_of(p: argparse.ArgumentParser) -> Any:
    """The action of a bare command (``autotune``, ``autotune lab``): its help, exit 0."""

    def action(args: argparse.Namespace) -> int:
        p.print_help()
        return 0

    return action
