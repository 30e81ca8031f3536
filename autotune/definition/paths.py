"""Where autotune writes, checked before anything is started: output paths that must be
writable, and study names (which may come from someone else's database) made safe as file
names.

``check_writable`` creates nothing: it proves a path could be written (it or its nearest
existing ancestor is a writable directory of the right kind), so a bad ``--run-dir``,
``--profile`` or ``-o`` is one line and exit 2 before Ray starts, not a traceback after the
budget is spent. ``file_stem`` maps any study name to a name that stays inside the directory it
is joined to.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from autotune.core.errors import ConfigError

__all__ = ["check_study_name", "check_writable", "file_stem"]

#: A study name that is also a safe file name: what ``--study-name`` may create.
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]{0,127}")


def check_study_name(name: str, *, flag: str = "--study-name") -> None:
    """A new study's name must be usable as a file name (profiles and reports are named after
    it): letters, digits and ``. _ + = -``, at most 128, not starting with a dot."""
    if not _SAFE.fullmatch(name) or ".." in name:
        raise ConfigError(
            f"{flag} {name!r}: use letters, digits and . _ + = - only (at most 128, no path "
            f"separators, no '..'), e.g. mlp-gloo-2r"
        )


def file_stem(name: str) -> str:
    """``name`` when it is a safe file name, else a safe name plus a short hash of ``name``
    (two different unsafe names never share a file)."""
    if _SAFE.fullmatch(name) and ".." not in name:
        return name
    cleaned = re.sub(r"[^A-Za-z0-9._+=-]+", "_", name).strip("._") or "study"
    return f"{cleaned[:100]}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"


def check_writable(path: Path, *, flag: str, directory: bool) -> None:
    """Raise ConfigError naming ``flag`` unless ``path`` (a directory when ``directory``, else
    a file) exists as that kind and is writable, or could be created. Creates nothing."""
    p = Path(path).expanduser().absolute()
    kind = "directory" if directory else "file"
    if p.exists():
        if directory and not p.is_dir():
            raise ConfigError(f"{flag} {path}: exists and is not a directory; give a directory")
        if not directory and p.is_dir():
            raise ConfigError(f"{flag} {path}: is a directory; give a file path")
        if not os.access(p, os.W_OK):
            raise ConfigError(f"{flag} {path}: not writable; choose a writable {kind}")
        return
    parent = p.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(
            f"{flag} {path}: {parent} is not a directory, so the {kind} cannot be created; "
            f"choose another place"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{flag} {path}: cannot be created ({parent} is not writable); choose a writable place"
        )


def check_command(command: str, *, who: str, path: str | None = None) -> None:
    """``command`` (a command's first word) is an executable file or found on ``path`` (this
    process's ``PATH`` by default); else a ``ConfigError`` that ``who`` (``autotune launch``,
    ``autotune run``) begins."""
    search = path if path is not None else os.environ.get("PATH", os.defpath)
    if shutil.which(command, path=search) is None:
        raise ConfigError(
            f"{who}: no such command {command!r} (not an executable file, nor on PATH)"
        )
