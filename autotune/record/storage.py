"""Optuna storage: an embedded SQLite file by default, any Optuna RDB URL by ``--storage``.

``check_url`` proves a URL can be opened without writing anything (so bad input leaves nothing
behind); ``open_storage`` then opens it with heartbeats, so trials of a driver that died
(``kill -9``) are closed as FAIL by Optuna itself when a later run starts trials.
"""

from __future__ import annotations

import re
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.core.errors import ConfigError

if TYPE_CHECKING:  # imported where a storage is opened: the CLI's entry stays light
    import optuna

__all__ = ["check_url", "default_url", "display_url", "open_storage", "redact"]

#: Seconds between heartbeats of a running trial; a trial silent for GRACE_S is stale.
HEARTBEAT_S = 10
GRACE_S = 60
#: How long a SQLite write waits for a lock another writer holds (concurrent trials, heartbeat
#: threads and other drivers write the same file) before it fails with "database is locked".
SQLITE_BUSY_TIMEOUT_S = 20.0
#: The databases SQLAlchemy (and so Optuna's RDB storage) speaks.
RDB_BACKENDS = ("sqlite", "postgresql", "mysql", "mariadb", "oracle", "mssql")


#: A URL's credentials in any text: ``scheme://user:password@``, the password up to the first
#: ``@`` on its line (a password may hold spaces: it was shown in full when it did).
_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):[^@\n]*@")
#: A password given as a query parameter (``?password=...``), which some drivers read.
_QUERY_PASSWORD = re.compile(r"((?:password|passwd|pwd)=)[^&\s]*", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with every URL password in it (``scheme://user:PASSWORD@host``, and
    ``password=`` query parameters) replaced by ``***``: for messages that quote a URL, a
    malformed one included, or a database error that does."""
    return _QUERY_PASSWORD.sub(r"\1***", _CREDENTIALS.sub(r"\1:***@", text))


def display_url(url: str) -> str:
    """``url`` as it may be shown: the password replaced by ``***`` (``redact``)."""
    return redact(url)


def default_url(run_dir: Path) -> str:
    return f"sqlite:///{run_dir / 'autotune.db'}"


def check_url(url: str, *, must_exist: bool = False) -> None:
    """Raise ConfigError if ``url`` cannot be opened; never creates or changes anything.

    ``must_exist``: a SQLite file that is not there yet is an error too (for commands that
    only read a study an earlier run wrote)."""
    import sqlalchemy
    from sqlalchemy.engine import make_url

    fix = "give an Optuna RDB URL such as sqlite:///path/to/autotune.db or postgresql://host/db"
    shown = display_url(url)
    try:
        parsed = make_url(url)
    except Exception:
        raise ConfigError(f"--storage {shown}: not a database URL; {fix}") from None
    if parsed.get_backend_name() not in RDB_BACKENDS:
        raise ConfigError(
            f"--storage {shown}: {parsed.get_backend_name()!r} is not a database Optuna can "
            f"store a study in ({', '.join(RDB_BACKENDS)}); {fix}"
        )
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if not db or db == ":memory:":
            raise ConfigError(f"--storage {shown}: an in-memory database keeps nothing; {fix}")
        path = Path(db)
        if must_exist and not path.exists():
            raise ConfigError(
                f"--storage {shown}: no such database; give the one `autotune run` used"
            )
        if path.exists():
            if not path.is_file():
                raise ConfigError(f"--storage {shown}: {path} is not a file; {fix}")
        elif not path.parent.is_dir():
            raise ConfigError(
                f"--storage {shown}: directory {path.parent} does not exist; create it first"
            )
        if not path.exists():
            return
    try:
        engine = sqlalchemy.create_engine(url)
    except (ImportError, sqlalchemy.exc.NoSuchModuleError) as e:
        fix = (
            "pip install 'ddp-autotune[postgres]'"
            if "postgres" in url.split(":")[0]
            else "pip install the module named"
        )
        raise ConfigError(
            f"--storage {shown}: its database driver is not installed ({e}); {fix}"
        ) from None
    try:
        with engine.connect():
            pass
        engine.dispose()
    except Exception as e:
        first = str(e).strip().splitlines()[0][:200].replace(url, shown)
        raise ConfigError(f"--storage {shown}: cannot open it ({first}); {fix}") from None


#: Attempts at opening a storage whose schema another driver is creating at the same moment.
SCHEMA_RACE_TRIES = 4


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """The study storage at ``url``, with heartbeats; SQLite with a busy timeout."""
    import optuna

    kwargs = {}
    if url.startswith("sqlite"):
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
    for attempt in range(1, SCHEMA_RACE_TRIES + 1):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S, **kwargs
                )
        except Exception as e:
            if attempt < SCHEMA_RACE_TRIES and schema_race(e):
                time.sleep(0.5 * attempt)
                continue
            first = str(e).strip().splitlines()[0][:200].replace(url, display_url(url))
            raise ConfigError(
                f"--storage {display_url(url)}: cannot open it as an Optuna storage ({first})"
            ) from None
    raise AssertionError("unreachable")


def schema_race(e: BaseException) -> bool:
    """Whether ``e`` is another driver creating Optuna's tables in the same new database at
    the same moment. PostgreSQL then refuses one of the two ``CREATE TABLE``s on its own
    catalog ("duplicate key value violates unique constraint pg_type_typname_nsp_index", seen
    in CI), or says a table already exists ("relation ... already exists"; SQLite's "table
    studies already exists", also seen in CI, where a test polled the database a run was
    creating), or that the schema's version was stamped by the other ("UNIQUE constraint
    failed: alembic_version.version_num", seen when two processes open one new SQLite file at
    once). Opened again, the tables are there to read."""
    text = str(e)
    return (
        "pg_type_typname_nsp_index" in text
        or "alembic_version" in text
        or ("already exists" in text and ("relation" in text or "table" in text))
    )
