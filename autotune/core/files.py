"""Writing a file whole: to a new temporary file beside it, then renamed over its name.

A reader never sees half a file, and a link planted under the name (to a file of someone
else's) is replaced, never written through: ``mkstemp`` creates its file and opens no link.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["replace_whole"]


def replace_whole(path: Path, fill: Callable[[IO[bytes]], Any], *, ordinary_mode: bool) -> Path:
    """``fill`` a new file beside ``path``, then rename it to ``path``. ``ordinary_mode``: give
    it the mode an ordinary new file gets under the umask; else it keeps ``mkstemp``'s (0600,
    the owner's only)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
        if ordinary_mode:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
