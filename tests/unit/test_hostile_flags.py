"""Flags and environment from a user's shell history, a CI log or someone's script: a storage
URL's password never reaches a message, whatever is wrong with the URL. Each case is a row of
docs/security.md (H-F..)."""

from __future__ import annotations

import pytest

from autotune.record.storage import display_url, redact
from tests.conftest import in_process

SECRET = "s3cretPW"
URLS = [
    pytest.param(f"postgresql://user:{SECRET}@host:notaport/db", id="H-F01"),
    pytest.param(f"postgresql://user:{SECRET}@[::1/db", id="H-F02"),
    pytest.param(f"nosuchdb://user:{SECRET}@host/db", id="H-F03"),
    pytest.param(f"postgresql://user:pa/{SECRET}@127.0.0.1:1/db", id="H-F04"),
    pytest.param(f"postgresql://127.0.0.1:1/db?user=u&password={SECRET}", id="H-F05"),
    pytest.param(f"postgresql://user:pass {SECRET}@127.0.0.1:1/db", id="H-F06"),
]


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize(
    "command",
    [
        ["run", "--space", "default", "--budget", "1m"],
        ["export", "--study-name", "s"],
        ["report", "--study-name", "s"],
        ["dashboard"],
    ],
    ids=["run", "export", "report", "dashboard"],
)
def test_no_message_shows_a_storage_password(tmp_path, url, command):
    out = in_process(*command, "--storage", url, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert SECRET not in out.stderr + out.stdout
    assert "***" in out.stderr or "password" not in url
    assert out.stderr.count("\n") == 1


def test_redact_hides_credentials_anywhere_in_a_text():
    text = f"cannot connect to postgresql://u:{SECRET}@h/db (mysql://a:{SECRET}@b/c failed)"
    assert SECRET not in redact(text)
    assert display_url("sqlite:////data/a:b@c.db") == "sqlite:////data/a:b@c.db"
