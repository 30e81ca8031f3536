"""docs/architecture.md matches the tree: every module and package it names exists, and every
package of the library is on its table."""

from __future__ import annotations

import re
from pathlib import Path

import autotune

ROOT = Path(autotune.__file__).parent.parent
PAGE = ROOT / "docs" / "architecture.md"


def test_every_module_the_page_names_exists():
    text = PAGE.read_text()
    named = set(re.findall(r"`(autotune/[\w/]+(?:\.py|/))`", text))
    # short names inside a package's row or a step (`search/loop.py`), or repository paths
    # (`bench/replay.py`)
    named |= set(re.findall(r"`((?:\w+/)+\w+\.py)`", text))
    assert len(named) > 30, "the page names the modules it describes"
    missing = sorted(
        p for p in named if not (ROOT / p).exists() and not (ROOT / "autotune" / p).exists()
    )
    assert missing == []


def test_every_package_of_the_library_is_on_the_page():
    text = PAGE.read_text()
    packages = sorted(p.name for p in (ROOT / "autotune").iterdir() if (p / "__init__.py").exists())
    assert packages and [p for p in packages if f"`autotune/{p}/`" not in text] == []


def test_every_module_a_package_row_names_is_in_that_package():
    rows = re.findall(r"^\| `autotune/(\w+)/` \|(.*)$", PAGE.read_text(), re.M)
    assert len(rows) >= 10
    missing = [
        f"{pkg}/{name}"
        for pkg, row in rows
        for name in re.findall(r"`(\w+\.py)`", row)
        if not (ROOT / "autotune" / pkg / name).exists()
    ]
    assert missing == []


def test_the_floors_on_the_page_are_the_order_the_layout_test_enforces():
    from tests.unit.test_layout import FLOORS

    section = PAGE.read_text().split("## Floors", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\d+\. `(\w+)` - ", section, re.M)
    assert listed == [f or "autotune" for f in FLOORS]
