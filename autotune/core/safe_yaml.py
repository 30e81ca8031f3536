"""The one place where YAML files become Python mappings, strictly.

Every loader (search spaces, study definitions, profiles) goes through here, so every unknown
key, missing key or wrong type is reported the same way: the file, the key, and the fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from autotune.core.errors import ConfigError


def read_mapping(path: Path, *, what: str) -> dict[str, Any]:
    """Parse ``path`` as a YAML mapping; ``what`` names the kind of file in errors."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{what} {path}{where}: not valid YAML ({problem})") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{what} {path}: expected a mapping at the top, got {type(data).__name__}"
        )
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


def dump(data: Mapping[str, Any]) -> str:
    """YAML text in the key order given, block style, for files people read."""
    return yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False, width=100)


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
