"""``autotune export``, ``report`` and ``dashboard``: commands that read a stored study.

Each command's arguments and its action sit side by side; ``autotune.cli.main`` registers them.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path
from typing import Any

from autotune.adapters import FORMATS, render
from autotune.cli.grammar import add_output, add_study_source
from autotune.core.errors import ConfigError
from autotune.core.files import replace_whole
from autotune.definition.paths import check_writable, file_stem
from autotune.profile.profile import Profile
from autotune.record.storage import display_url

__all__ = ["add_commands", "default_run_dir", "load_study", "only_study", "storage_url"]


def default_run_dir() -> Path:
    """Where run outputs go: $AUTOTUNE_HOME, else ~/.autotune (never the source tree)."""
    return Path(os.environ.get("AUTOTUNE_HOME") or Path.home() / ".autotune")


def add_commands(sub: Any) -> None:
    """The study commands, on the ``autotune`` parser's subcommands ``sub``."""
    e = sub.add_parser(
        "export",
        help="write the best profile of an existing study",
        description="Write the profile of a stored study: its chosen configuration, or "
        "COMPLETE trial N.",
    )
    add_study_source(e, "the study to export (default: the only study in the storage)")
    add_output(e, "profile path (default: stdout)")
    e.add_argument(
        "--trial",
        type=int,
        metavar="N",
        help="export COMPLETE trial N instead of the chosen one (e.g. another Pareto point)",
    )
    e.add_argument(
        "--format",
        choices=["profile", *FORMATS],
        default="profile",
        help="profile: the YAML profile (default); lightning, accelerate, hf-trainer: a Python "
        "snippet that applies it in that framework (docs/frameworks.md)",
    )
    e.add_argument(
        "--from",
        dest="from_profile",
        type=Path,
        metavar="PROFILE",
        help="with --format: the snippet of this profile file instead of a stored study's",
    )
    e.set_defaults(action=cmd_export)

    rp = sub.add_parser(
        "report",
        help="write an HTML report and PNG figures of a study",
        description="Write report.html and one PNG per figure of a stored study.",
    )
    add_study_source(rp, "the study to report (default: the only study in the storage)")
    add_output(rp, "directory for report.html and the PNGs (default: RUN_DIR/reports/STUDY_NAME)")
    rp.set_defaults(action=cmd_report)

    db = sub.add_parser(
        "dashboard",
        help="open the study storage in optuna-dashboard",
        description="Serve the study storage in optuna-dashboard (every study in it).",
    )
    add_study_source(db, "print the address of this study's page (the server shows every study)")
    db.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1); one beyond loopback needs --expose",
    )
    db.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    db.add_argument(
        "--expose",
        action="store_true",
        help="allow a --host beyond loopback: optuna-dashboard has no authentication, and "
        "anyone who reaches it can delete and rename studies",
    )
    db.set_defaults(action=cmd_dashboard)


def storage_url(args: argparse.Namespace) -> str:
    """The storage a command reads: --storage, else the run directory's SQLite file, which
    must exist (nothing is created by a command that only reads)."""
    from autotune.record import storage as storage_mod

    url = args.storage or storage_mod.default_url(
        (args.run_dir or default_run_dir()).expanduser().absolute()
    )
    storage_mod.check_url(url, must_exist=True)
    return url


def load_study(url: str, name: str) -> Any:
    """The study ``name`` in ``url``; a missing one is an error listing those there."""
    import optuna

    from autotune.record.storage import open_storage

    try:  # open_storage: a database another process is creating right now is opened again
        return optuna.load_study(study_name=name, storage=open_storage(url))
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(url)]
        raise ConfigError(
            f"--study-name {name}: no such study in {display_url(url)}; it has "
            f"{', '.join(names) or 'none'}"
        ) from None


def only_study(url: str, name: str | None, verb: str) -> str:
    """The study a command reads: ``name`` (``--study-name``), else the storage's only one; a
    storage of several (or none) is an error listing them."""
    import optuna

    if name is not None:
        return name
    names = [s.study_name for s in optuna.get_all_study_summaries(url)]
    if len(names) != 1:
        raise ConfigError(
            f"--study-name: {display_url(url)} holds {len(names)} studies "
            f"({', '.join(names) or 'none'}); name the one to {verb} with --study-name NAME"
        )
    return names[0]


def cmd_export(args: argparse.Namespace) -> int:
    from autotune.profile.export import export_profile, study_profile

    if args.output:
        check_writable(args.output, flag="--output", directory=False)
    if args.from_profile is not None:
        if args.format == "profile":
            raise ConfigError(
                "--from: it gives a framework's snippet; add --format lightning, "
                "accelerate or hf-trainer"
            )
        return _write_snippet(render(Profile.load(args.from_profile), args.format), args.output)
    url = storage_url(args)
    study = load_study(url, only_study(url, args.study_name, "export"))
    if args.format != "profile":
        text = render(study_profile(study, trial=args.trial), args.format)
        return _write_snippet(text, args.output)
    if args.output:
        print(export_profile(study, args.output, trial=args.trial))
    else:
        sys.stdout.write(study_profile(study, trial=args.trial).to_yaml())
    return 0


def _write_snippet(text: str, output: Path | None) -> int:
    """A framework's snippet to stdout, or written whole to ``output`` (its path printed)."""
    if output is None:
        sys.stdout.write(text)
    else:
        print(replace_whole(output, lambda f: f.write(text.encode()), ordinary_mode=True))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from autotune.report import report

    url = storage_url(args)
    name = only_study(url, args.study_name, "report")
    study = load_study(url, name)
    if not study.trials:
        raise ConfigError(f"--study-name {name}: the study has no trials yet; run it first")
    # the study's name may come from someone else's database: never a path of its own
    out = args.output or (
        (args.run_dir or default_run_dir()).expanduser() / "reports" / file_stem(name)
    )
    check_writable(out, flag="--output", directory=True)
    for path in report.write(report.build(study), out):
        print(path)
    return 0


def check_listen(host: str, port: int, *, expose: bool) -> bool:
    """Raise ConfigError unless optuna-dashboard could listen on ``host:port``: a port, an
    IPv4 address (its server's family) that is loopback unless ``expose``, and free now.
    Whether ``host`` reaches beyond loopback."""
    import ipaddress
    import socket

    if not 1 <= port <= 65535:
        raise ConfigError(f"--port {port}: not a TCP port; choose one from 1 to 65535")
    try:
        infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise ConfigError(
            f"--host {host}: not an IPv4 address or a name of one ({e}); e.g. 127.0.0.1"
        ) from None
    beyond = not all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)
    if beyond and not expose:
        raise ConfigError(
            f"--host {host}: not a loopback address, and optuna-dashboard's API deletes and "
            f"renames studies without authentication for anyone who reaches it; add --expose "
            f"to serve there anyway, or leave --host out (127.0.0.1)"
        )
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as its server does
        try:
            s.bind(infos[0][4])
        except OSError as e:
            fix = "choose another --port or stop what listens there"
            if e.errno == errno.EADDRNOTAVAIL:
                fix = "use an address of this machine, e.g. 127.0.0.1"
            elif e.errno == errno.EACCES:
                fix = "choose a port above 1023"
            raise ConfigError(
                f"--host {host} --port {port}: cannot listen there ({e.strerror}); {fix}"
            ) from None
    return beyond


def cmd_dashboard(args: argparse.Namespace) -> int:
    import optuna

    from autotune.cli.dashboard import new_token, serve

    exposed = check_listen(args.host, args.port, expose=args.expose)
    url = storage_url(args)
    token = new_token()
    page = f"http://{args.host}:{args.port}/dashboard/"
    if args.study_name:
        load_study(url, args.study_name)  # the error naming the studies there
        study_id = optuna.storages.get_storage(url).get_study_id_from_name(args.study_name)
        page += f"studies/{study_id}"  # optuna-dashboard's address of the study's page
    page += f"?token={token}"  # the gate's (cli.dashboard): only this address opens it
    print(f"optuna-dashboard for {display_url(url)} at {page} (Ctrl-C stops it)", flush=True)
    if exposed:
        print(
            f"autotune: note: --expose: anyone who reaches {args.host}:{args.port} with the "
            "address above can delete and rename studies (its token is the only check)",
            file=sys.stderr,
            flush=True,
        )
    serve(url, host=args.host, port=args.port, token=token)
    return 0
