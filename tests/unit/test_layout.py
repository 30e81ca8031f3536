"""The package's structure rules (docs/architecture.md), read from the code: no import circle,
no private name imported from another module, no module much over 400 lines (420 at most),
no display code in the tuning loop."""

from __future__ import annotations

import ast
from pathlib import Path

import autotune

PACKAGE = Path(autotune.__file__).parent
MODULES = {p.stem: p for p in sorted(PACKAGE.glob("*.py")) if p.stem != "__init__"}
#: The modules of the tuning loop: they emit events and print nothing.
LOOP = ("tuner", "search", "objective", "budget", "validation", "export", "study_record", "measure")


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every ``autotune`` import in ``path``, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autotune"):
            if node.module == "autotune":  # from autotune import x: x is a module or a name
                for a in node.names:
                    out.append(
                        (f"autotune.{a.name}" if a.name in MODULES else "autotune", [a.name])
                    )
            else:
                out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names if a.name.startswith("autotune."))
    return out


def test_no_import_circle():
    graph = {
        name: {m.split(".")[1] for m, _ in imports(path) if m.count(".") == 1} - {name}
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


def test_no_private_name_is_imported_from_another_module():
    bad = [
        f"{name}: {module}.{n}"
        for name, path in MODULES.items()
        for module, names in imports(path)
        for n in names
        if n.startswith("_") and n not in ("_yaml", "_compat")  # package-private modules
    ]
    assert bad == []


def test_no_module_is_much_over_400_lines():
    long = {n: len(p.read_text().splitlines()) for n, p in MODULES.items()}
    assert {n: k for n, k in long.items() if k > 420} == {}


def test_the_tuning_loop_prints_nothing_and_imports_no_display():
    for name in LOOP:
        text = MODULES[name].read_text()
        assert "print(" not in text and "rich" not in text, name
        assert not any(
            m in ("autotune.progress", "autotune.report") for m, _ in imports(MODULES[name])
        )
