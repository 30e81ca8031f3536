"""Lightning (``lightning.pytorch``): a profile as a ``DDPStrategy``, ``Trainer`` arguments and
``DataLoader`` kwargs::

    from autotune import Profile
    from autotune.adapters import lightning as tuned

    profile = Profile.load("best.yaml")
    trainer = Trainer(strategy=tuned.ddp_strategy(profile), **tuned.trainer_kwargs(profile),
                      accelerator="gpu", devices=8)
    loader = DataLoader(dataset, shuffle=True, **tuned.dataloader_kwargs(profile))

``DDPStrategy`` passes its extra keyword arguments to ``DistributedDataParallel`` (bucket size,
bucket views, static graph) and registers ``ddp_comm_hook`` with ``ddp_comm_state``, but only
on a CUDA device; the ``AutotuneProfile`` callback that ``trainer_kwargs`` adds registers the
hook where Lightning did not (CPU), and switches TF32 on for the ``tf32`` precision. Lightning
imports happen inside the functions. The environment travels by ``autotune launch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.adapters.common import (
    DDP_KNOBS,
    HOOK_IMPORT,
    TF32_LINES,
    Mapping,
    batch,
    compile_mapping,
    data_mapping,
    dataloader_kwargs,
    drain_at_exit,
    header,
    hook_label,
    torch_hook,
)

if TYPE_CHECKING:
    from autotune.profile.profile import Profile

__all__ = [
    "PRECISION",
    "callbacks",
    "dataloader_kwargs",
    "ddp_strategy",
    "mapping",
    "snippet",
    "strategy_kwargs",
    "trainer_kwargs",
]

#: The profile's precision -> ``Trainer(precision=...)``. bf16 and fp16 are autocast as in a
#: trial (fp16 with a GradScaler: Lightning's ``16-mixed``); tf32 is fp32 with TF32 matmuls.
PRECISION = {"fp32": "32-true", "tf32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}

#: How the ``compile`` knob is applied: no Trainer or DDPStrategy argument compiles the model.
COMPILE_HOW = (
    "no Trainer or DDPStrategy argument: pass the compiled module, "
    "trainer.fit(torch.compile(module, mode={mode!r}, dynamic=False)); Lightning runs its "
    "compiled steps inside DDP, as the trial ran the compiled model"
)


def strategy_kwargs(profile: Profile) -> dict[str, Any]:
    """``DDPStrategy`` keyword arguments: the DDP kwargs, and ``ddp_comm_hook`` with
    ``ddp_comm_state`` when the profile has a hook."""
    kwargs: dict[str, Any] = dict(profile.ddp_kwargs)
    hook = torch_hook(profile)
    if hook is not None:
        kwargs["ddp_comm_state"], kwargs["ddp_comm_hook"] = hook
    return kwargs


def ddp_strategy(profile: Profile, **kwargs: Any) -> Any:
    """A ``lightning.pytorch.strategies.DDPStrategy`` with the profile's DDP settings;
    ``kwargs`` (``process_group_backend``, ``timeout``, ...) go to it too and win."""
    from lightning.pytorch.strategies import DDPStrategy

    drain_at_exit()
    return DDPStrategy(**{**strategy_kwargs(profile), **kwargs})


def callbacks(profile: Profile) -> list[Any]:
    """``[AutotuneProfile(profile)]``: registers the comm hook where Lightning did not (on a
    CPU) and switches TF32 on for the ``tf32`` precision."""
    from autotune.adapters.lightning_callback import AutotuneProfile

    return [AutotuneProfile(profile)]


def trainer_kwargs(profile: Profile, world_size: int | None = None) -> dict[str, Any]:
    """``Trainer`` keyword arguments: ``precision``, ``accumulate_grad_batches`` (at the
    profile's global batch on ``world_size`` ranks, see ``common.batch``) and ``callbacks``
    (extend the list with your own)."""
    _, steps = batch(profile, world_size)
    return {
        "precision": PRECISION[profile.precision],
        "accumulate_grad_batches": steps,
        "callbacks": callbacks(profile),
    }


def mapping(profile: Profile) -> Mapping:
    """Which of the profile's knobs these arguments carry, and how the others are applied."""
    micro, steps = batch(profile)
    ddp = profile.ddp_kwargs
    tf32 = "; TF32 matmuls switched on by the AutotuneProfile callback"
    mapped = {
        "micro_batch": f"DataLoader(batch_size={micro}), Trainer(accumulate_grad_batches={steps})",
        **{k: f"DDPStrategy({k}={ddp[k]!r})" for k in DDP_KNOBS},
        "comm_hook": f"DDPStrategy(ddp_comm_hook={hook_label(profile)}); Lightning registers "
        "it on CUDA only, the AutotuneProfile callback on a CPU",
        "powersgd_rank": "DDPStrategy(ddp_comm_state=PowerSGDState(matrix_approximation_rank))",
        "precision": f"Trainer(precision={PRECISION[profile.precision]!r})"
        + (tf32 if profile.precision == "tf32" else ""),
        **data_mapping(profile),
    }
    compiled, unmapped = compile_mapping(profile, COMPILE_HOW)
    return Mapping.of("Lightning", {**mapped, **compiled}, unmapped)


def snippet(profile: Profile) -> str:
    """Python a user pastes: the strategy, the Trainer and the DataLoader, values written
    out, with the mapping and the environment as comments."""
    hook = profile.ddp["comm_hook"]
    _, steps = batch(profile)
    lines = [*header(profile, "Lightning", "lightning"), ""]
    lines += [
        "from lightning.pytorch import Trainer",
        "from lightning.pytorch.strategies import DDPStrategy",
        "from torch.utils.data import DataLoader",
    ]
    hook_lines = _hook_kwargs(hook)
    if hook["name"] != "none":
        lines.append(HOOK_IMPORT)
    if profile.precision == "tf32":
        lines.append("import torch")
    lines += [
        "",
        "strategy = DDPStrategy(",
        *(f"    {k}={v!r}," for k, v in profile.ddp_kwargs.items()),
        *hook_lines,
        ")",
    ]
    lines += [
        "trainer = Trainer(",
        "    strategy=strategy,",
        f"    precision={PRECISION[profile.precision]!r},",
        f"    accumulate_grad_batches={steps},",
        "    # accelerator=..., devices=..., num_nodes=..., max_steps=..., callbacks=...",
        ")",
    ]
    if profile.precision == "tf32":
        lines += TF32_LINES
    data = ", ".join(f"{k}={v!r}" for k, v in dataloader_kwargs(profile).items())
    lines += [f"train_loader = DataLoader(dataset, shuffle=True, {data})", ""]
    if hook["name"] != "none":
        lines += [
            "# Lightning registers ddp_comm_hook on CUDA devices only: on a CPU, pass",
            "# callbacks=autotune.adapters.lightning.callbacks(profile) to the Trainer.",
        ]
    return "\n".join([*lines, *mapping(profile).comment()]) + "\n"


def _hook_kwargs(hook: dict[str, Any]) -> list[str]:
    """The ``DDPStrategy`` lines of a snippet that pass the hook (none for ``none``)."""
    name = hook["name"]
    if name == "none":
        return []
    if name != "powersgd":
        return [f"    ddp_comm_hook=default_hooks.{name}_compress_hook,"]
    return [
        "    ddp_comm_state=powerSGD_hook.PowerSGDState(",
        f"        None, matrix_approximation_rank={hook['matrix_approximation_rank']}, "
        f"start_powerSGD_iter={hook['start_powerSGD_iter']}",
        "    ),",
        "    ddp_comm_hook=powerSGD_hook.powerSGD_hook,",
    ]
