"""The suite's own scheduling under pytest-xdist (``tests/conftest.py``): every test file that
uses the shared ``finished_run`` or the network lab is in the group that keeps it on one worker
with the others that do, and a node id maps to its group."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import GROUPS, TESTS, group_of


def test_every_file_that_shares_a_run_or_the_lab_is_in_its_group():
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        takes = {
            a.arg for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for a in f.args.args
        }
        marks = {  # pytestmark = ...: the mark names it lists
            n.attr
            for s in tree.body
            if isinstance(s, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in s.targets)
            for n in ast.walk(s.value)
            if isinstance(n, ast.Attribute)
        }
        if "finished_run" in takes:
            assert GROUPS.get(path.name) == "finished_run", path.name
        if "netlab" in marks:
            assert GROUPS.get(path.name) == "netlab", path.name
    for name in GROUPS:  # nothing named that is not there
        assert list(TESTS.rglob(name)), name


def test_a_node_id_is_grouped_by_its_file_or_its_named_group():
    assert group_of("tests/integration/test_netlab_script.py::test_x[a::b]") == "netlab"
    assert group_of("tests/integration/test_run_cli.py::test_y") == "finished_run"
    assert group_of("tests/unit/test_logfile.py::test_z") == str(Path("tests/unit/test_logfile.py"))
