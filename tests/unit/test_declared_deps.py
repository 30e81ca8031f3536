"""An honest install: every third-party package that the installed code imports (autotune/
and the ready-made parts installed beside it: trainers/, search_spaces/, studies/) is named
in pyproject.toml, as a dependency or, where it is imported only by an optional part, in an
extra; and the distribution carries its license."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions

import tomllib

from tests.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
#: What `pip install` installs as the package (pyproject's [tool.setuptools]).
INSTALLED = ("autotune", "trainers", "search_spaces", "studies")
#: Import names whose distribution is named otherwise, for packages not installed here (an
#: installed one is found from its metadata).
KNOWN = {"yaml": "pyyaml", "mlflow": "mlflow-skinny", "sklearn": "scikit-learn"}


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> str:
    return normalize(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line.strip()).group(0))


def third_party_imports() -> dict[str, set[str]]:
    """Top-level import name -> the files importing it, for every import outside the standard
    library and the package itself (relative imports are the package's own)."""
    found: dict[str, set[str]] = {}
    for root in INSTALLED:
        for path in sorted((REPO / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ("autotune", "__future__"):
                        found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def distributions_of(module: str) -> set[str]:
    installed = packages_distributions().get(module)
    if installed:
        return {normalize(d) for d in installed}
    return {normalize(KNOWN.get(module, module))}


def declared() -> tuple[set[str], set[str]]:
    """(the dependencies, everything named in an extra), as normalized names."""
    project = PYPROJECT["project"]
    deps = {requirement_name(r) for r in project["dependencies"]}
    extras = {requirement_name(r) for rs in project["optional-dependencies"].values() for r in rs}
    return deps, extras


def test_the_imports_were_found():
    imports = third_party_imports()
    assert {"torch", "yaml", "optuna", "ray"} <= set(imports)


def test_every_third_party_import_is_declared():
    deps, extras = declared()
    missing = {
        module: sorted(files)
        for module, files in third_party_imports().items()
        if not distributions_of(module) & (deps | extras)
    }
    assert missing == {}, "imported but not named in pyproject.toml"


def test_applying_a_profile_needs_only_dependencies_that_are_always_installed():
    deps, _ = declared()
    assert {"torch", "pyyaml"} <= deps
    # the tuner stays a default dependency: `autotune run` works on a plain install
    assert {"optuna", "ray", "sqlalchemy", "numpy", "scipy", "rich"} <= deps


def test_the_license_is_declared_and_shipped():
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
