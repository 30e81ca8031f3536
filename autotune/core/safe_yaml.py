"""The one place where YAML files become Python mappings, strictly.

Every loader (search spaces, study definitions, profiles) goes through here, so every unknown
key, missing key or wrong type is reported the same way: the file, the key, and the fix.

These files may come from someone else, so what they can make this process do is bounded: a
file is read only when it is a regular file of at most ``MAX_BYTES``, and what it parses to
may hold at most ``MAX_NODES`` values counted as if every alias were written out (an
"alias bomb" of a few hundred bytes otherwise expands to gigabytes when it is printed or
compared) and nest at most ``MAX_DEPTH`` deep. Python tags are refused by the safe loader.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from autotune.core.errors import ConfigError

#: The largest YAML file read (a profile is about 5 KB, a study definition 1 KB).
MAX_BYTES = 1 << 20
#: The most values a file may parse to, every alias counted as written out.
MAX_NODES = 100_000
#: The deepest nesting of mappings and lists.
MAX_DEPTH = 32


def _read_text(path: Path, what: str) -> str:
    """The file's text: a regular file (not a FIFO, a device or a directory) of at most
    ``MAX_BYTES``, read without waiting on a writer."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{what} {path}: not a regular file; give a YAML file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ConfigError(
            f"{what} {path}: larger than {MAX_BYTES // 1024} KiB, which no {what} is; give the "
            f"file autotune wrote"
        )
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path}: not UTF-8 text; give a YAML file") from None


def check_size(data: Any, *, where: str) -> None:
    """``data`` (parsed YAML) within ``MAX_NODES`` values, aliases counted as written out,
    and ``MAX_DEPTH`` levels; a ConfigError naming ``where`` otherwise. Stops counting at the
    limit, so an alias bomb costs no more than ``MAX_NODES`` steps."""
    count = 0
    todo: list[tuple[Any, int]] = [(data, 0)]
    while todo:
        value, depth = todo.pop()
        count += 1
        if count > MAX_NODES:
            raise ConfigError(
                f"{where}: more than {MAX_NODES} values once its aliases are expanded; not a "
                f"file autotune reads"
            )
        if depth > MAX_DEPTH:
            raise ConfigError(f"{where}: nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, dict):
            todo.extend((v, depth + 1) for kv in value.items() for v in kv)
        elif isinstance(value, list):
            todo.extend((v, depth + 1) for v in value)


def read_mapping(path: Path, *, what: str) -> dict[str, Any]:
    """Parse ``path`` as a YAML mapping; ``what`` names the kind of file in errors."""
    text = _read_text(path, what)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{what} {path}{where}: not valid YAML ({problem})") from None
    except RecursionError:  # the parser recurses once per level of nesting
        raise ConfigError(f"{what} {path}: nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as e:  # a number past Python's digit limit (4,300): no value of ours
        raise ConfigError(
            f"{what} {path}: a number too long to be any setting's ({str(e).split(':')[0]})"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{what} {path}: expected a mapping at the top, got {type(data).__name__}"
        )
    check_size(data, where=f"{what} {path}")
    return data


def check_keys(
    mapping: Mapping[str, Any],
    *,
    where: str,
    allowed: Iterable[str],
    required: Iterable[str] = (),
) -> None:
    """Unknown keys and missing required keys are errors that name ``where`` and the key."""
    allowed = list(allowed)
    for key in mapping:
        if key not in allowed:
            raise ConfigError(
                f"{where}: unknown key {key!r}; allowed keys are {', '.join(allowed)}"
            )
    for key in required:
        if key not in mapping:
            raise ConfigError(f"{where}: missing required key {key!r}")


class _NoAliases(yaml.SafeDumper):
    """Writes a value shared by two places twice, never as an anchor and alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(data: Mapping[str, Any]) -> str:
    """YAML text in the key order given, block style, for files people read; no aliases."""
    return yaml.dump(
        dict(data), Dumper=_NoAliases, sort_keys=False, default_flow_style=False, width=100
    )


def builtin_names(package: str) -> list[str]:
    """Names of the YAML files a built-in package (``autotune.studies``...) ships."""
    return sorted(p.stem for p in Path(str(resources.files(package))).glob("*.yaml"))


def find_builtin(package: str, name_or_path: str, *, flag: str, kind: str) -> Path:
    """A built-in YAML file by name, or any YAML file by path; errors name ``flag``."""
    names = ", ".join(builtin_names(package))
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if not p.is_file():
            raise ConfigError(
                f"{flag}: no such file {name_or_path}; give a YAML file or a built-in "
                f"{kind}: {names}"
            )
        return p
    builtin = Path(str(resources.files(package))) / f"{name_or_path}.yaml"
    if not builtin.is_file():
        raise ConfigError(
            f"{flag}: unknown {kind} {name_or_path!r}; choose one of {names} or give a path "
            f"to a YAML file"
        )
    return builtin
