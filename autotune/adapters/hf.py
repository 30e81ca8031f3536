"""The Hugging Face ``Trainer``: a profile as ``TrainingArguments``::

    from transformers import Trainer, TrainingArguments
    from autotune import Profile
    from autotune.adapters import hf as tuned

    profile = Profile.load("best.yaml")
    args = TrainingArguments(output_dir="out", **tuned.training_arguments_kwargs(profile))
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    tuned.set_ddp_kwargs(trainer, profile)  # bucket views and the comm hook: no argument
    trainer.train()

``TrainingArguments`` carries the bucket size (``ddp_bucket_cap_mb``), the static graph
(``ddp_static_graph``), the DataLoader settings (``dataloader_*``), the precision (``bf16``,
``fp16``, ``tf32``), the micro-batch (``per_device_train_batch_size``) and the accumulation
(``gradient_accumulation_steps``). It has no argument for bucket views nor for a comm hook:
the Trainer wraps the model through its Accelerate ``Accelerator`` in ``train()``, and
``set_ddp_kwargs`` puts them on that Accelerator's ``DistributedDataParallelKwargs``
(``trainer.accelerator.ddp_handler``) before. transformers and Accelerate are imported inside
the functions. The environment travels by ``autotune launch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.adapters import accelerate as acc
from autotune.adapters.common import (
    Mapping,
    batch,
    compile_mapping,
    data_mapping,
    drain_at_exit,
    header,
    hook_label,
)

if TYPE_CHECKING:
    from autotune.profile.profile import Profile

__all__ = ["mapping", "set_ddp_kwargs", "snippet", "training_arguments_kwargs"]

#: What ``set_ddp_kwargs`` sets on the Trainer's Accelerator: no ``TrainingArguments`` field.
NO_ARGUMENT = (
    "TrainingArguments has no argument for it: autotune.adapters.hf.set_ddp_kwargs(trainer, "
    "profile) sets it on trainer.accelerator.ddp_handler before trainer.train()"
)
#: How the ``compile`` knob is applied: TrainingArguments' compile is Accelerate's.
COMPILE_HOW = (
    "TrainingArguments(torch_compile=True, torch_compile_mode={mode!r}) has Accelerate compile "
    "the DDP-wrapped module, not the model inside DDP that the trial measured: the profile's "
    "gain holds for the latter only; measure the former before relying on it"
)
#: The data knob -> its ``TrainingArguments`` field.
DATA_FIELDS = {
    k: f"dataloader_{k}"
    for k in ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
}


def training_arguments_kwargs(profile: Profile, world_size: int | None = None) -> dict[str, Any]:
    """``TrainingArguments`` keyword arguments (add ``output_dir``, ``max_steps``, ...).

    ``ddp_find_unused_parameters=False`` is DDP's own default, which autotune measured: the
    Trainer would otherwise pass True for a model that is not a ``PreTrainedModel``.
    ``dataloader_pin_memory`` is always given (the Trainer's default is True). ``tf32`` is True
    for the tf32 precision and otherwise left as the script has it."""
    micro, steps = batch(profile, world_size)
    drain_at_exit()
    ddp = profile.ddp_kwargs
    bucket = float(ddp["bucket_cap_mb"])
    out: dict[str, Any] = {
        "per_device_train_batch_size": micro,
        "gradient_accumulation_steps": steps,
        "ddp_bucket_cap_mb": int(bucket) if bucket.is_integer() else bucket,
        "ddp_static_graph": bool(ddp["static_graph"]),
        "ddp_find_unused_parameters": False,
        **{DATA_FIELDS[k]: v for k, v in profile.data.items()},
        "bf16": profile.precision == "bf16",
        "fp16": profile.precision == "fp16",
    }
    if profile.precision == "tf32":
        out["tf32"] = True
    return out


def set_ddp_kwargs(trainer: Any, profile: Profile) -> Any:
    """Put what ``TrainingArguments`` cannot carry (``gradient_as_bucket_view``, the comm hook
    with PowerSGD's options) and the rest of the profile's DDP kwargs on the Trainer's
    ``Accelerator.ddp_handler``, which ``prepare`` wraps the model with in ``train()``; call it
    after ``Trainer(...)`` and before ``trainer.train()``. Returns the handler."""
    from accelerate.utils import DistributedDataParallelKwargs

    accelerator = trainer.accelerator
    if accelerator.ddp_handler is None:
        accelerator.ddp_handler = DistributedDataParallelKwargs(find_unused_parameters=False)
    (mine,) = acc.kwargs_handlers(profile)
    for name in acc.ddp_kwargs(profile):
        setattr(accelerator.ddp_handler, name, getattr(mine, name))
    return accelerator.ddp_handler


def mapping(profile: Profile) -> Mapping:
    """Which of the profile's knobs ``TrainingArguments`` carries, and how the others are
    applied."""
    kw = training_arguments_kwargs(profile)
    precision = {"bf16": "bf16=True", "fp16": "fp16=True", "tf32": "tf32=True"}
    mapped = {
        "micro_batch": f"per_device_train_batch_size={kw['per_device_train_batch_size']}, "
        f"gradient_accumulation_steps={kw['gradient_accumulation_steps']}",
        "bucket_cap_mb": f"ddp_bucket_cap_mb={kw['ddp_bucket_cap_mb']!r}",
        "static_graph": f"ddp_static_graph={kw['ddp_static_graph']!r}",
        "precision": precision.get(profile.precision, "bf16=False, fp16=False (fp32)"),
        **data_mapping(profile, "dataloader_{k}={v!r}"),
    }
    hook = f"{NO_ARGUMENT} (this profile's: {hook_label(profile)})"
    unmapped = {
        "gradient_as_bucket_view": NO_ARGUMENT,
        "comm_hook": hook,
        "powersgd_rank": f"PowerSGD's matrix_approximation_rank: {NO_ARGUMENT}",
    }
    compiled, uncompiled = compile_mapping(profile, COMPILE_HOW)
    return Mapping.of("Hugging Face Trainer", {**mapped, **compiled}, {**unmapped, **uncompiled})


def snippet(profile: Profile) -> str:
    """Python a user pastes: the TrainingArguments, the Trainer and the lines that set what
    no argument carries, values written out, with the mapping and the environment as
    comments."""
    kw = training_arguments_kwargs(profile)
    lines = [*header(profile, "Hugging Face Trainer", "hf-trainer"), ""]
    lines += [
        "from accelerate.utils import DDPCommunicationHookType",
        "from transformers import Trainer, TrainingArguments",
        "",
        "args = TrainingArguments(",
        '    output_dir="out",',
        *(f"    {k}={v!r}," for k, v in kw.items()),
        "    # max_steps=..., learning_rate=..., ...",
        ")",
        "trainer = Trainer(model=model, args=args, train_dataset=dataset)",
        "# No TrainingArguments field for these: set them on the Trainer's Accelerator,",
        "# which wraps the model in DistributedDataParallel in trainer.train().",
        "ddp = trainer.accelerator.ddp_handler",
    ]
    extra = acc.ddp_kwargs(profile)
    lines.append(f"ddp.gradient_as_bucket_view = {extra['gradient_as_bucket_view']!r}")
    lines.append(f"ddp.comm_hook = DDPCommunicationHookType.{extra['comm_hook']}")
    if "comm_state_option" in extra:
        lines.append(f"ddp.comm_state_option = {extra['comm_state_option']!r}")
    lines += ["trainer.train()", ""]
    return "\n".join([*lines, *mapping(profile).comment()]) + "\n"
