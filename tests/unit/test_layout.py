"""The package's structure rules (docs/architecture.md), read from the code: the layering of
the packages (every import follows the declared floors; a rank imports only the core), no import
circle between modules, no private name imported from another module, no module over 800
lines (one over 400 is named in a warning), no function over 120 (over 60 named), no display
code in the tuning loop, no module file name in two packages."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import autotune

PACKAGE = Path(autotune.__file__).parent
#: Every module of the library by dotted name (``autotune.search.loop``), packages' own
#: ``__init__`` under the package's name.
MODULES = {
    ".".join(("autotune", *p.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(
        ".__init__"
    ): p
    for p in sorted(PACKAGE.rglob("*.py"))
}
#: The modules of the tuning loop: they emit events and print nothing.
LOOP = (
    "autotune.tuner",
    "autotune.search.loop",
    "autotune.search.objective",
    "autotune.search.budget",
    "autotune.search.validation",
    "autotune.profile.export",
    "autotune.record.study",
    "autotune.search.opening",
    "autotune.launch.measurer",
    "autotune.search.assembly",
)


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every ``autotune`` import in ``path``, at any depth; ``from P import
    m`` of a module ``m`` counts as an import of ``P.m``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autotune"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((sub, []) if sub in MODULES else (node.module, [a.name]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names if a.name.startswith("autotune."))
    return out


def package(module: str) -> str:
    """``autotune.search.loop`` -> ``search``; a top-level module is its own package."""
    return module.split(".")[1] if module.count(".") >= 1 else ""


def test_modules_were_found():
    assert "autotune.rank.measure" in MODULES and "autotune.core.config" in MODULES


#: The floors, from the ground up (docs/architecture.md, *Floors*): a module imports only from
#: its own package and those below it. ``""`` is the package's face, ``autotune/__init__.py``
#: (``Profile`` for the user's script); a top-level module is a floor of its own.
FLOORS = (
    "core",
    "definition",
    "rank",
    "record",
    "launch",
    "limit",
    "profile",
    "script",
    "search",
    "report",
    "replay",
    "tuner",
    "adapters",
    "",
    "netlab",
    "cli",
)


def test_every_package_has_a_floor_and_imports_only_its_own_and_those_below():
    assert {package(name) for name in MODULES} == set(FLOORS)
    up = [
        f"{name} ({package(name) or 'autotune'}) imports {m} ({package(m) or 'autotune'})"
        for name, path in MODULES.items()
        for m, _ in imports(path)
        if FLOORS.index(package(m)) > FLOORS.index(package(name))
    ]
    assert up == []


def test_a_rank_imports_only_the_core_and_the_core_only_itself():
    allowed = {"rank": {"rank", "core"}, "core": {"core"}}
    bad = [
        f"{name} imports {m}"
        for name, path in MODULES.items()
        if package(name) in allowed
        for m, _ in imports(path)
        if m != "autotune" and package(m) not in allowed[package(name)]
    ]
    assert bad == []


def test_no_import_circle():
    graph = {
        name: {m for m, _ in imports(path) if m in MODULES} - {name}
        for name, path in MODULES.items()
    }

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    circles = sorted(name for name in graph if name in reach(name))
    assert circles == []


def test_no_module_name_is_used_in_two_packages():
    """A file name says one job: ``measure.py`` in two packages had a reader look for the
    measuring in the one that launches."""
    where: dict[str, list[str]] = {}
    for path in MODULES.values():
        if path.name != "__init__.py":
            where.setdefault(path.name, []).append(path.parent.name)
    assert {name: dirs for name, dirs in where.items() if len(dirs) > 1} == {}


def test_no_private_name_is_imported_from_another_module():
    bad = [
        f"{name}: {module}.{n}"
        for name, path in MODULES.items()
        for module, names in imports(path)
        for n in names
        if n.startswith("_")
    ]
    assert bad == []


#: Size is a smell, not a rule: a module over ``MODULE_WARN`` lines is named in a warning (is it
#: still one idea?); only one over ``MODULE_CEILING`` fails.
MODULE_WARN, MODULE_CEILING = 400, 800


def test_no_module_is_over_the_ceiling_and_long_ones_are_named():
    long = {n: len(p.read_text().splitlines()) for n, p in MODULES.items()}
    for n, k in sorted(long.items()):
        if k > MODULE_WARN:
            warnings.warn(f"{n} has {k} lines: is it still one idea?", stacklevel=1)
    assert {n: k for n, k in long.items() if k > MODULE_CEILING} == {}


def test_the_tuning_loop_prints_nothing_and_imports_no_display():
    for name in LOOP:
        text = MODULES[name].read_text()
        assert "print(" not in text and "rich" not in text, name
        assert not any(
            m in ("autotune.report.progress", "autotune.report.report")
            for m, _ in imports(MODULES[name])
        )


def test_only_the_record_package_reads_or_writes_study_attributes():
    """The study's attributes are the record layer's (``autotune.record``): anywhere else
    they are read through its typed records and accessors."""
    touching = [
        name
        for name, path in MODULES.items()
        if package(name) != "record"
        and any(w in path.read_text() for w in ("user_attrs", "set_user_attr", "system_attr"))
    ]
    assert touching == []


#: As for modules: a function over ``FUNCTION_WARN`` lines is named, one over
#: ``FUNCTION_CEILING`` fails.
FUNCTION_WARN, FUNCTION_CEILING = 60, 120


def test_no_function_is_over_the_ceiling_and_nothing_silences_the_type_checker():
    long, ignored = [], []
    for name, path in MODULES.items():
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > FUNCTION_WARN:
                    warnings.warn(f"{name}.{node.name} has {n} lines", stacklevel=1)
                if n > FUNCTION_CEILING:
                    long.append(f"{name}.{node.name}: {n}")
        ignored += [
            f"{name}:{i}" for i, ln in enumerate(text.splitlines(), 1) if "type: ignore" in ln
        ]
    assert long == [] and ignored == []
