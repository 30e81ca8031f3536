"""Script mode: checking ``autotune run ... -- CMD`` before anything starts, and the command each
node runs.

``script.job`` reads what the tuner needs from the command and the settings - the nodes
(``--nodes``, else torchrun's ``--nnodes``, else 1), the ranks per node (torchrun's
``--nproc-per-node``), the world size (their product, or ``--world-size``), the global batch
(``--global-batch``, which the script cannot tell autotune) - and refuses, with a one-line error
and nothing started, what script mode does not do: a command that is not on ``PATH``, a
world size or node count that disagrees with the command's, concurrent trials, a ``--placement``
that contradicts the nodes.

On several nodes the command must be torchrun (``torchrun ...`` or ``python -m
torch.distributed.run ...``): autotune starts it on every node (``node_command``) with
``--nnodes N --node-rank I --master-addr HOST --master-port PORT`` inserted after the launcher's
name, the first node's address and a free port chosen by autotune. That is torchrun's static
rendezvous: node I's ranks are global ranks ``I*K .. I*K+K-1``, so global rank 0, whose step
reports the trial is measured by, runs on the first node. The arguments autotune sets are the
user's only where they agree with it (``--nnodes N``); a rendezvous of the user's
(``--node-rank``, ``--master-addr``, ``--master-port``, ``--rdzv-endpoint``, ``--rdzv-backend``,
``--standalone``) is refused, naming the argument. One node runs the command exactly as typed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from autotune.core.errors import ConfigError
from autotune.definition.paths import check_command
from autotune.definition.studydef import StudyDefinition

__all__ = ["ScriptJob", "node_command", "script_job"]

_NPROC = ("--nproc-per-node", "--nproc_per_node")
_NNODES = ("--nnodes",)
#: torchrun's arguments that choose the rendezvous, which autotune sets on several nodes.
_RENDEZVOUS = (
    ("--node-rank", "--node_rank"),
    ("--master-addr", "--master_addr"),
    ("--master-port", "--master_port"),
    ("--rdzv-endpoint", "--rdzv_endpoint"),
    ("--rdzv-backend", "--rdzv_backend"),
    ("--standalone",),
)
_TORCHRUN_MODULE = "torch.distributed.run"
#: torchrun's switch that runs a module as the script.
_MODULE = ("-m", "--module")


@dataclass(frozen=True)
class ScriptJob:
    """What the tuner takes from a workload, for a user's command."""

    command: tuple[str, ...]
    global_batch: int
    world_size: int
    name: str
    """For the study's default name: ``script-<script stem>``."""
    tokens_per_sample: int | None = None
    nodes: int = 1
    """Nodes one run of the command spans (``--nodes`` or torchrun's ``--nnodes``)."""


def _option(cmd: tuple[str, ...], names: tuple[str, ...]) -> str | None:
    for i, word in enumerate(cmd):
        for n in names:
            if word == n and i + 1 < len(cmd):
                return cmd[i + 1]
            if word.startswith(n + "="):
                return word.split("=", 1)[1]
    return None


def _given(cmd: tuple[str, ...], names: tuple[str, ...]) -> str | None:
    """The word of ``cmd`` that gives one of ``names`` (as ``--name`` or ``--name=value``)."""
    return next((w for w in cmd for n in names if w == n or w.startswith(n + "=")), None)


def launcher_end(cmd: tuple[str, ...]) -> int | None:
    """Where torchrun's own arguments start in ``cmd`` (after ``torchrun``, or after ``python
    -m torch.distributed.run``); None when the command is not torchrun."""
    if Path(cmd[0]).name == "torchrun":
        return 1
    for i, word in enumerate(cmd[:-1]):
        if word == "-m" and cmd[i + 1] == _TORCHRUN_MODULE:
            return i + 2
    return None


def _launcher_args(cmd: tuple[str, ...]) -> tuple[str, ...]:
    """torchrun's own arguments: from its name to the script (the first word ending .py) or
    to ``-m``/``--module`` (a module run as the script): the words after are the script's."""
    start = launcher_end(cmd)
    if start is None:
        return ()
    end = next(
        (i for i in range(start, len(cmd)) if cmd[i].endswith(".py") or cmd[i] in _MODULE),
        len(cmd),
    )
    return cmd[start:end]


def _nodes(cmd: tuple[str, ...], given: int | None) -> int:
    """The nodes of one run: ``--nodes`` (``given``), else torchrun's ``--nnodes``, else 1;
    both given, they must agree. An elastic range (``1:4``) is refused: a trial needs a fixed
    world to be measured."""
    text = _option(_launcher_args(cmd) or cmd, _NNODES)
    nnodes = None
    if text is not None:
        low, _, high = text.partition(":")
        if not low.isdigit() or int(low) < 1 or (high and high != low):
            raise ConfigError(
                f"autotune run -- CMD: --nnodes {text}: give a fixed number of nodes (an "
                "elastic range changes the world a trial is measured in)"
            )
        nnodes = int(low)
    if given is not None and nnodes is not None and given != nnodes:
        raise ConfigError(
            f"--nodes {given} disagrees with the command's --nnodes {nnodes}; drop one of them"
        )
    return given or nnodes or 1


def _check_multinode(cmd: tuple[str, ...], nodes: int) -> None:
    """Several nodes: the command is torchrun, and its rendezvous is autotune's to set."""
    if launcher_end(cmd) is None:
        raise ConfigError(
            f"autotune run -- CMD: {nodes} nodes need torchrun (torchrun ... or python -m "
            f"{_TORCHRUN_MODULE} ...), which autotune starts on every node with its node rank; "
            f"{cmd[0]} is not torchrun"
        )
    args = _launcher_args(cmd)
    for names in _RENDEZVOUS:
        word = _given(args, names)
        if word is not None:
            raise ConfigError(
                f"autotune run -- CMD: {word.split('=')[0]}: on {nodes} nodes autotune sets "
                "torchrun's rendezvous (--node-rank, --master-addr, --master-port on every "
                "node); drop it"
            )


def node_command(
    cmd: tuple[str, ...] | list[str], *, nodes: int, node_rank: int, addr: str, port: int
) -> list[str]:
    """The command node ``node_rank`` of ``nodes`` runs (module doc): ``cmd`` itself on one
    node; else torchrun with the rendezvous inserted after the launcher's name (and
    ``--nnodes`` where the user left it out)."""
    cmd = list(cmd)
    if nodes == 1:
        return cmd
    start = launcher_end(tuple(cmd))
    if start is None:
        raise ValueError(f"{cmd[0]} is not torchrun")
    ours = [f"--node-rank={node_rank}", f"--master-addr={addr}", f"--master-port={port}"]
    if _option(_launcher_args(tuple(cmd)), _NNODES) is None:
        ours.insert(0, f"--nnodes={nodes}")
    return [*cmd[:start], *ours, *cmd[start:]]


def script_job(d: StudyDefinition) -> tuple[StudyDefinition, ScriptJob]:
    """Check script mode's command and settings; the definition as script mode runs it (one
    trial at a time, one bundle per node) and the job. Raises ``ConfigError`` naming the
    fix. ``limit`` stays the user's: in script mode it is the first measurement only
    (``script.first_measurement``), and no limit probe runs at the end."""
    cmd = d.command
    check_command(cmd[0], who="autotune run")
    if d.global_batch is None:
        raise ConfigError(
            "autotune run -- CMD: give --global-batch N, the samples per optimizer step over all "
            "ranks of your script at its defaults (autotune keeps it for every trial)"
        )
    nodes = _nodes(cmd, d.nodes)
    if nodes > 1:
        _check_multinode(cmd, nodes)
    nproc = _option(_launcher_args(cmd) or cmd, _NPROC)
    world = d.world_size
    if nproc is not None:
        if not nproc.isdigit() or int(nproc) < 1:
            raise ConfigError(
                f"autotune run -- CMD: --nproc-per-node {nproc}: give a number of processes"
            )
        if world is not None and world != int(nproc) * nodes:
            raise ConfigError(
                f"--world-size {world} disagrees with the command's {nodes} node(s) x "
                f"--nproc-per-node {nproc}; drop --world-size"
            )
        world = int(nproc) * nodes
    elif launcher_end(cmd) is not None and world not in (None, nodes):
        raise ConfigError(
            f"--world-size {world}: torchrun starts one rank per node without --nproc-per-node "
            f"({nodes} in all); give it --nproc-per-node {max(world // nodes, 1)} and drop "
            "--world-size"
        )
    elif world is not None and world % nodes:
        raise ConfigError(
            f"--world-size {world} is not a whole number of ranks on each of {nodes} nodes; "
            "give torchrun's --nproc-per-node instead"
        )
    world = world or nodes
    if d.global_batch % world:
        raise ConfigError(
            f"--global-batch {d.global_batch} is not divisible by the world size {world}; give "
            "a global batch that is"
        )
    if d.concurrent_trials not in (None, 1):
        raise ConfigError("--concurrent-trials: script mode measures one trial at a time")
    placement = "strict_spread" if nodes > 1 else "strict_pack"
    if d.placement not in ("pack", placement, placement.removeprefix("strict_")):
        raise ConfigError(
            f"--placement {d.placement}: script mode places one bundle per node, "
            f"{placement} on {nodes} node(s); drop --placement"
        )
    script = next((w for w in cmd[1:] if w.endswith(".py")), cmd[0])
    job = ScriptJob(cmd, d.global_batch, world, f"script-{Path(script).stem}", nodes=nodes)
    definition = replace(d, world_size=world, nodes=nodes, concurrent_trials=1, placement=placement)
    return definition, job
