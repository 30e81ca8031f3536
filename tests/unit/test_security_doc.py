"""docs/security.md's table of hostile inputs and the tests that hold it stay one: every row
has a test that names its ID, and every ID a test names is a row."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ID = re.compile(r"\bH-[A-Z]\d\d\b")


def doc_rows() -> set[str]:
    text = (REPO / "docs" / "security.md").read_text()
    return {
        m.group(0)
        for line in text.splitlines()
        if line.startswith("| H-")
        for m in [ID.search(line)]
        if m
    }


def ids_in_tests() -> set[str]:
    found: set[str] = set()
    for path in (REPO / "tests").rglob("*.py"):
        if path.name != "test_security_doc.py":
            found |= set(ID.findall(path.read_text()))
    return found


def test_every_row_has_a_test_and_every_test_id_a_row():
    rows, tested = doc_rows(), ids_in_tests()
    assert sorted(rows - tested) == [], "rows of docs/security.md with no test"
    assert sorted(tested - rows) == [], "test IDs with no row in docs/security.md"


def test_the_table_has_at_least_60_rows():
    assert len(doc_rows()) >= 60
