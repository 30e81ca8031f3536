"""Text from a profile, a study or a database reaches the terminal with its control characters
escaped (docs/security.md, H-E01 to H-E03): an escape sequence cannot draw a fake line over
autotune's own, in its one-line errors, its live display or its summary."""

from __future__ import annotations

import io

import optuna
from rich.console import Console

from autotune.core import events as ev
from autotune.core.values import terminal_safe
from autotune.report.progress import RunView
from tests.conftest import in_process
from tests.unit.test_profile_env import write

#: Clears the line, draws a green "all good" and hides what follows.
FAKE = "\r\x1b[2K\x1b[32mautotune: all good\x1b[0m\x1b[8m"


def test_terminal_safe_escapes_every_control_and_format_character():
    assert terminal_safe("plain text, 1.5x [1.2, 1.8]") == "plain text, 1.5x [1.2, 1.8]"
    assert terminal_safe(FAKE) == "\\r\\x1b[2K\\x1b[32mautotune: all good\\x1b[0m\\x1b[8m"
    assert terminal_safe("a\u202eb\nc\x85") == "a\\u202eb\\nc\\x85"


def test_h_e01_an_escape_laden_key_in_a_profile_is_escaped_in_the_one_line_error(tmp_path):
    """H-E01."""
    path = write(tmp_path / "p.yaml", lambda d: d["measured"].update({FAKE: 1}))
    for command in (("env", str(path)), ("export", "--from", str(path), "--format", "lightning")):
        r = in_process(*command, cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert "\x1b" not in r.stderr and "\r" not in r.stderr
        assert "\\x1b[32mautotune: all good" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_h_e02_an_escape_laden_study_name_in_a_database_is_escaped(tmp_path):
    """H-E02."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    optuna.create_study(study_name=FAKE, storage=url)
    r = in_process("report", "--storage", url, "--study-name", "nope", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "\x1b" not in r.stderr and "\\x1b[32m" in r.stderr


def test_h_e03_a_stored_reason_in_the_live_display_is_escaped():
    """H-E03."""
    out = io.StringIO()
    view = RunView(Console(file=out, force_terminal=False, width=300), budget_s=60)
    view(ev.Note(f"trial 3 FAIL crash: {FAKE}"))
    assert "\x1b" not in out.getvalue() and "\\x1b[32mautotune: all good" in out.getvalue()
