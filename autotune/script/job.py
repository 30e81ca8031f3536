"""Script mode: checking ``autotune run ... -- CMD`` before anything starts.

``script.job`` reads what the tuner needs from the command and the settings - the world size
(``--world-size``, else torchrun's ``--nproc-per-node``), the global batch (``--global-batch``,
which the script cannot tell autotune) - and refuses, with a one-line error and nothing
started, what script mode does not do: a command that is not on ``PATH``, torchrun over
several nodes, a world size that disagrees with the command's, ranks spread over nodes,
the limit probe (it runs autotune's own ranks), concurrent trials. The trial's placement group
is ``strict_pack``: the command runs as a Ray task in its first bundle, on its one node
(``TrialRunner.call_in_group``). ``autotune.script.trial`` runs the trials.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from autotune.core.errors import ConfigError
from autotune.definition.paths import check_command
from autotune.definition.studydef import StudyDefinition

__all__ = ["ScriptJob", "script_job"]

_NPROC = ("--nproc-per-node", "--nproc_per_node")
_NNODES = ("--nnodes",)


@dataclass(frozen=True)
class ScriptJob:
    """What the tuner takes from a workload, for a user's command."""

    command: tuple[str, ...]
    global_batch: int
    world_size: int
    name: str
    """For the study's default name: ``script-<script stem>``."""
    tokens_per_sample: int | None = None


def _option(cmd: tuple[str, ...], names: tuple[str, ...]) -> str | None:
    for i, word in enumerate(cmd):
        for n in names:
            if word == n and i + 1 < len(cmd):
                return cmd[i + 1]
            if word.startswith(n + "="):
                return word.split("=", 1)[1]
    return None


def script_job(d: StudyDefinition) -> tuple[StudyDefinition, ScriptJob]:
    """Check script mode's command and settings; the definition as script mode runs it (no
    limit probe, one trial at a time) and the job. Raises ``ConfigError`` naming the fix."""
    cmd = d.command
    check_command(cmd[0], who="autotune run")
    if d.global_batch is None:
        raise ConfigError(
            "autotune run -- CMD: give --global-batch N, the samples per optimizer step over all "
            "ranks of your script at its defaults (autotune keeps it for every trial)"
        )
    nnodes = _option(cmd, _NNODES)
    if nnodes not in (None, "1", "1:1"):
        raise ConfigError(
            f"autotune run -- CMD: --nnodes {nnodes}: script mode runs the command on one node; "
            "drop --nnodes (or use a built-in trainer on the Ray cluster)"
        )
    nproc = _option(cmd, _NPROC)
    world = d.world_size
    if nproc is not None:
        if not nproc.isdigit() or int(nproc) < 1:
            raise ConfigError(
                f"autotune run -- CMD: --nproc-per-node {nproc}: give a number of processes"
            )
        if world is not None and world != int(nproc):
            raise ConfigError(
                f"--world-size {world} disagrees with the command's --nproc-per-node {nproc}; "
                "drop --world-size"
            )
        world = int(nproc)
    world = world or 1
    if d.global_batch % world:
        raise ConfigError(
            f"--global-batch {d.global_batch} is not divisible by the world size {world}; give "
            "a global batch that is"
        )
    if d.concurrent_trials not in (None, 1):
        raise ConfigError("--concurrent-trials: script mode measures one trial at a time")
    if "spread" in d.placement:
        raise ConfigError(
            f"--placement {d.placement}: script mode runs the command on one node (its "
            "placement group is strict_pack); drop --placement"
        )
    script = next((w for w in cmd[1:] if w.endswith(".py")), cmd[0])
    job = ScriptJob(cmd, d.global_batch, world, f"script-{Path(script).stem}")
    definition = replace(
        d, world_size=world, limit=False, concurrent_trials=1, placement="strict_pack"
    )
    return definition, job
