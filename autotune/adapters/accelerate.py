"""Hugging Face Accelerate: a profile as ``Accelerator`` arguments::

    from accelerate import Accelerator
    from autotune import Profile
    from autotune.adapters import accelerate as tuned

    profile = Profile.load("best.yaml")
    accelerator = Accelerator(**tuned.accelerator_kwargs(profile))
    loader = DataLoader(dataset, shuffle=True, **tuned.dataloader_kwargs(profile))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        with accelerator.accumulate(model):  # no_sync() on all but the last micro-step
            ...

``DistributedDataParallelKwargs`` carries the bucket size, bucket views, static graph and the
comm hook (``comm_hook`` and PowerSGD's ``comm_state_option``), registered by ``prepare`` on
GPUs and on CPUs alike; ``mixed_precision`` the autocast precision and
``gradient_accumulation_steps`` the accumulation. Accelerate imports happen inside the
functions. The environment travels by ``autotune launch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.adapters.common import (
    DDP_KNOBS,
    TF32_LINES,
    Mapping,
    batch,
    compile_mapping,
    data_mapping,
    dataloader_kwargs,
    drain_at_exit,
    header,
    hook_label,
)

if TYPE_CHECKING:
    from autotune.profile.profile import Profile

__all__ = [
    "HOOK_TYPE",
    "MIXED_PRECISION",
    "accelerator_kwargs",
    "dataloader_kwargs",
    "ddp_kwargs",
    "kwargs_handlers",
    "mapping",
    "snippet",
]

#: The profile's precision -> ``Accelerator(mixed_precision=...)`` (autocast, with a GradScaler
#: for fp16, as a trial runs it). tf32 runs without autocast; Accelerate has no TF32 switch.
MIXED_PRECISION = {"fp32": "no", "tf32": "no", "bf16": "bf16", "fp16": "fp16"}
#: The profile's hook -> the name of its ``accelerate.utils.DDPCommunicationHookType``.
HOOK_TYPE = {"none": "NO", "fp16": "FP16", "bf16": "BF16", "powersgd": "POWER_SGD"}
TF32_WHY = (
    "Accelerator has no TF32 argument (mixed_precision='no' is fp32): set "
    "torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True before "
    "training, as the snippet does"
)

COMPILE_HOW = (
    "Accelerator(dynamo_plugin=...) compiles the DDP-wrapped module, not the model inside DDP "
    "as the trial did: compile it before prepare, model = torch.compile(model, mode={mode!r}, "
    "dynamic=False); prepare then wraps the compiled model and does not compile it again"
)


def ddp_kwargs(profile: Profile) -> dict[str, Any]:
    """``DistributedDataParallelKwargs`` arguments: the DDP kwargs, ``comm_hook`` (the name of
    its ``DDPCommunicationHookType``) and, for PowerSGD, ``comm_state_option``."""
    hook = profile.ddp["comm_hook"]
    out: dict[str, Any] = {**profile.ddp_kwargs, "comm_hook": HOOK_TYPE[hook["name"]]}
    if hook["name"] == "powersgd":
        out["comm_state_option"] = {
            k: hook[k] for k in ("matrix_approximation_rank", "start_powerSGD_iter")
        }
    return out


def kwargs_handlers(profile: Profile) -> list[Any]:
    """``[DistributedDataParallelKwargs(...)]`` for ``Accelerator(kwargs_handlers=...)``."""
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs

    kwargs = ddp_kwargs(profile)
    kwargs["comm_hook"] = DDPCommunicationHookType[kwargs["comm_hook"]]
    drain_at_exit()
    return [DistributedDataParallelKwargs(**kwargs)]


def accelerator_kwargs(profile: Profile, world_size: int | None = None) -> dict[str, Any]:
    """``Accelerator`` keyword arguments: ``mixed_precision``, ``gradient_accumulation_steps``
    (at the profile's global batch on ``world_size`` ranks, see ``common.batch``) and
    ``kwargs_handlers``."""
    _, steps = batch(profile, world_size)
    return {
        "mixed_precision": MIXED_PRECISION[profile.precision],
        "gradient_accumulation_steps": steps,
        "kwargs_handlers": kwargs_handlers(profile),
    }


def mapping(profile: Profile) -> Mapping:
    """Which of the profile's knobs these arguments carry, and how the others are applied."""
    micro, steps = batch(profile)
    handler = "DistributedDataParallelKwargs"
    mapped = {
        "micro_batch": f"DataLoader(batch_size={micro}), Accelerator(gradient_accumulation_steps"
        f"={steps}) with `accelerator.accumulate(model)` around each micro-step",
        **{k: f"{handler}({k}={profile.ddp[k]!r})" for k in DDP_KNOBS},
        "comm_hook": f"{handler}(comm_hook=DDPCommunicationHookType."
        f"{HOOK_TYPE[profile.ddp['comm_hook']['name']]}): {hook_label(profile)}",
        "powersgd_rank": f"{handler}(comm_state_option={{'matrix_approximation_rank': ...}})",
        **data_mapping(profile),
    }
    compiled, unmapped = compile_mapping(profile, COMPILE_HOW)
    mapped.update(compiled)
    if profile.precision == "tf32":
        unmapped["precision"] = TF32_WHY
    else:
        mapped["precision"] = f"Accelerator(mixed_precision={MIXED_PRECISION[profile.precision]!r})"
    return Mapping.of("Accelerate", mapped, unmapped)


def snippet(profile: Profile) -> str:
    """Python a user pastes: the Accelerator and the DataLoader, values written out, with the
    mapping and the environment as comments."""
    kwargs = ddp_kwargs(profile)
    hook = kwargs.pop("comm_hook")
    state = kwargs.pop("comm_state_option", None)
    _, steps = batch(profile)
    lines = [*header(profile, "Accelerate", "accelerate"), ""]
    lines += [
        "from accelerate import Accelerator",
        "from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs",
        "from torch.utils.data import DataLoader",
    ]
    if profile.precision == "tf32":
        lines.append("import torch")
    args = [f"    {k}={v!r}," for k, v in kwargs.items()]
    args.append(f"    comm_hook=DDPCommunicationHookType.{hook},")
    if state:
        args.append(f"    comm_state_option={state!r},")
    lines += ["", "ddp = DistributedDataParallelKwargs(", *args, ")"]
    lines += [
        "accelerator = Accelerator(",
        f"    mixed_precision={MIXED_PRECISION[profile.precision]!r},",
        f"    gradient_accumulation_steps={steps},",
        "    kwargs_handlers=[ddp],",
        ")",
    ]
    if profile.precision == "tf32":
        lines += TF32_LINES
    data = ", ".join(f"{k}={v!r}" for k, v in dataloader_kwargs(profile).items())
    lines += [
        f"train_loader = DataLoader(dataset, shuffle=True, {data})",
        "# model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)",
        "# each micro-step inside `with accelerator.accumulate(model):`",
        "",
    ]
    return "\n".join([*lines, *mapping(profile).comment()]) + "\n"
