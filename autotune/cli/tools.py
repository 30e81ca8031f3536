"""``autotune env``, ``launch``, ``lab`` and the listings (``spaces``, ``trainers``,
``studies``): commands around a profile, the network lab and what is built in.

Each command's arguments and its action sit side by side; ``autotune.cli.main`` registers them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from autotune.cli.grammar import print_help_of
from autotune.core.errors import ConfigError
from autotune.definition.paths import check_command

__all__ = ["add_commands"]


def add_commands(sub: Any) -> None:
    """The tool commands, on the ``autotune`` parser's subcommands ``sub``."""
    v = sub.add_parser(
        "env", help="print a profile's environment as shell export lines (quoted, for eval)"
    )
    v.add_argument("profile", type=Path, help="the profile YAML (autotune run's -o/--output)")
    v.set_defaults(action=cmd_env)

    la = sub.add_parser(
        "launch",
        help="become a command (exec) with a profile's environment applied",
        usage="autotune launch PROFILE -- COMMAND [ARGS...]",
    )
    la.add_argument("profile", type=Path, help="the profile YAML (autotune run's -o/--output)")
    la.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="the command to become, after -- (e.g. -- torchrun --nproc-per-node 2 train.py)",
    )
    la.set_defaults(action=cmd_launch)

    lab = sub.add_parser(
        "lab", help="a multi-node Ray cluster on this machine: namespaces and a shaped link"
    )
    lab.set_defaults(action=print_help_of(lab))  # bare `autotune lab`: its help, exit 0
    lab_sub = lab.add_subparsers(
        dest="lab_command",
        title="lab commands",
        metavar="LAB_COMMAND",
        parser_class=type(lab),
        help="`autotune lab LAB_COMMAND --help` describes one",
    )
    lu = lab_sub.add_parser("up", help="build the lab and start Ray on every node (root)")
    lu.add_argument("--nodes", type=int, default=2, help="Ray nodes, one namespace each (2)")
    lu.add_argument("--rate", default="1gbit", help="each node's link, as tc writes it (1gbit)")
    lu.add_argument(
        "--cpus-per-node",
        type=int,
        help="CPUs each Ray node offers (default: this machine's cores / nodes)",
    )
    lu.set_defaults(action=cmd_lab)
    lab_sub.add_parser(
        "down", help="stop the lab's processes and delete its namespaces"
    ).set_defaults(action=cmd_lab)
    lab_sub.add_parser("status", help="what exists of the lab").set_defaults(action=cmd_lab)
    le = lab_sub.add_parser(
        "exec", help="run a command in a node's namespace, RAY_ADDRESS set to the lab's head"
    )
    le.add_argument("--node", type=int, default=0, help="which node's namespace (0: the head)")
    le.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        metavar="-- CMD ...",
        help="the command to run in the node's namespace, after --",
    )
    le.set_defaults(action=cmd_lab)

    sp = sub.add_parser("spaces", help="list the built-in search spaces and the knobs they may use")
    sp.set_defaults(action=cmd_spaces)
    tr = sub.add_parser("trainers", help="list the built-in trainers")
    tr.set_defaults(action=cmd_trainers)
    st = sub.add_parser("studies", help="list the built-in study definitions")
    st.set_defaults(action=cmd_studies)


def _command(words: list[str]) -> list[str]:
    """The command after ``--`` (``autotune launch P -- CMD``, ``autotune lab exec -- CMD``)."""
    return words[1:] if words[:1] == ["--"] else words


def cmd_env(args: argparse.Namespace) -> int:
    """The profile's environment (only ``profile.ALLOWED_ENV``'s variables, checked at load) as
    ``export`` lines whose names and values are quoted: ``eval`` runs nothing else."""
    from autotune.profile.profile import Profile, shell_exports

    sys.stdout.write(shell_exports(Profile.load(args.profile).env))
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    """Replace this process with the command (exec), the profile's environment applied, so that
    Ctrl-C and SIGTERM reach the command itself (torchrun then stops its own workers)."""
    from autotune.profile.profile import Profile

    cmd = _command(args.cmd)
    if not cmd:
        raise ConfigError("autotune launch: no command; write autotune launch PROFILE -- CMD ...")
    profile = Profile.load(args.profile)
    # AUTOTUNE_PROFILE: the script's Profile.load() without a path finds this profile
    env = {**os.environ, **profile.env, "AUTOTUNE_PROFILE": str(Path(args.profile).resolve())}
    env.pop("AUTOTUNE_REPORT_DIR", None)  # the real job reports to no trial
    check_command(cmd[0], who="autotune launch", path=env.get("PATH", os.defpath))
    for diff in profile.hardware_differences():
        print(f"autotune: warning: measured on other hardware: {diff}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        raise ConfigError(f"autotune launch: cannot run {cmd[0]!r}: {e.strerror}") from None
    return 0  # not reached: exec replaced this process


def cmd_lab(args: argparse.Namespace) -> int:
    from autotune import netlab

    if args.lab_command == "up":
        lab = netlab.up(nodes=args.nodes, rate=args.rate, cpus_per_node=args.cpus_per_node)
        ips = ", ".join(netlab.node_ip(i) for i in range(lab.nodes))
        print(
            f"lab up: {lab.nodes} Ray nodes ({ips}, {lab.cpus_per_node} CPU each), "
            f"every link shaped to {lab.rate}"
        )
        print(f"head    {lab.address} (namespace {netlab.node_ns(0)})")
        print("run     autotune lab exec -- autotune run --address auto --study lab")
        print("down    autotune lab down")
        return 0
    if args.lab_command == "down":
        netlab.check_host()
        gone = netlab.down()
        print(f"lab down: deleted {', '.join(gone)}" if gone else "lab down: no lab was up")
        return 0
    if args.lab_command == "status":
        netlab.check_host()
        st = netlab.status()
        if not st["namespaces"]:
            print("no lab is up")
            return 0
        lab = st["lab"]
        if lab is None:
            print(
                f"debris of a lab (no record): {', '.join(st['namespaces'])}; run autotune lab down"
            )
        else:
            print(f"lab: {lab['nodes']} nodes, {lab['rate']}, head {st['address']}")
        for n in st["nodes"]:
            print(
                f"  {n['namespace']:9} {n['address']:12} {n['processes']:3} processes  {n['qdisc']}"
            )
        return 0
    cmd = _command(args.cmd)
    return netlab.exec_in(cmd, node=args.node)


def cmd_spaces(args: argparse.Namespace) -> int:
    from autotune.core.knobs import KNOBS
    from autotune.definition.space import SearchSpace, available_spaces

    for name in available_spaces():
        s = SearchSpace.load(name)
        print(f"{name:10} {s.description}")
    print("\nknobs a space may use (section.name: what it does):")
    for k in KNOBS.values():
        print(f"  {k.section}.{k.name}: {k.doc}")
    return 0


def cmd_trainers(args: argparse.Namespace) -> int:
    from autotune.rank.workload import available_trainers

    for name, doc in available_trainers().items():
        print(f"{name:12} {doc}")
    return 0


def cmd_studies(args: argparse.Namespace) -> int:
    from autotune.definition.studydef import StudyDefinition, available_studies

    for name in available_studies():
        print(f"{name:10} {StudyDefinition.load(name).description}")
    return 0
