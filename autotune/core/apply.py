"""Applying a configuration: the one place where a trial's settings become live torch state.

Both sides call these functions and nothing else to apply a configuration: the rank that
measures a trial (``autotune.rank.measure``) and the user's training script, through ``Profile``
(``autotune.profile.profile``). So a script applies exactly what was measured: there is no second
implementation to drift.

Contract:

* Each function takes the configuration's own values, as ``TrialConfig`` and the profile hold
  them (``ddp`` kwargs with ``compile``, ``comm_hook`` mapping, ``data`` kwargs, ``precision``
  name, micro-batch, accumulation steps), and nothing else from it.
* ``set_threads`` and ``set_tf32`` change the process; they set every flag they own, so that a
  process running trial after trial (the launcher's pool) never keeps an earlier trial's value.
  Every other function only builds or wraps the objects it is given or returns.
* Nothing here measures, reads files, prints or changes environment variables (those are put in
  the process before it starts: ``Profile.apply_env``, ``autotune launch``, Ray); the one
  exceptions are ``drain_torch_threads``, which ``wrap`` registers to run at exit and which reads
  the process's own thread states in ``/proc``, and ``compile_model``, which looks for the C++
  compiler on ``PATH`` before it compiles (``core.compiling.problem``).
* ``torch`` is imported inside the functions, so that importing ``autotune`` stays light.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from autotune.core import compiling
from autotune.core.validate import check_compile

__all__ = [
    "autocast",
    "autocast_dtype",
    "compile_model",
    "dataloader_kwargs",
    "drain_torch_threads",
    "grad_scaler",
    "is_last_micro_step",
    "micro_step",
    "register_comm_hook",
    "set_tf32",
    "set_threads",
    "wrap",
]

#: At exit: how long ``drain_torch_threads`` waits at most, and how many looks in a row, the GIL
#: released between them, must find none of torch's threads running.
DRAIN_TIMEOUT_S = 5.0
DRAIN_QUIET_LOOKS = 3
_DRAINING: list[bool] = []  # registered with atexit (once per process)
#: DDP's own ``bucket_cap_mb`` default.
DDP_BUCKET_MB = 25.0

#: The process's own TF32 flags (matmul, cuDNN), read the first time ``set_tf32`` runs in the
#: process and restored for every configuration that does not ask for TF32.
_TF32_DEFAULTS: tuple[bool, bool] | None = None


def set_threads(threads: int) -> None:
    """torch's intra-op threads for this process (``OMP_NUM_THREADS`` of the configuration)."""
    import torch

    torch.set_num_threads(threads)


def set_tf32(on: bool) -> None:
    """TF32 matmuls and cuDNN convolutions on (precision ``tf32``), or back to the flags this
    process had before autotune first set them: a pooled rank process must not keep an earlier
    trial's flags, and a user's own choice stands for every other precision."""
    import torch

    global _TF32_DEFAULTS
    if _TF32_DEFAULTS is None:
        _TF32_DEFAULTS = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    matmul, cudnn = (True, True) if on else _TF32_DEFAULTS
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn


def autocast_dtype(precision: str) -> Any:
    """The autocast dtype of a precision: ``torch.bfloat16`` for bf16, ``torch.float16`` for
    fp16, None for fp32 and tf32 (which run without autocast)."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def autocast(precision: str, device_type: str) -> AbstractContextManager[Any]:
    """The context for the forward pass and loss: ``torch.autocast`` to the precision's dtype,
    or a no-op for fp32 and tf32 (tf32 is a process flag: ``set_tf32``)."""
    import torch

    dtype = autocast_dtype(precision)
    if dtype is None:
        return nullcontext()
    return torch.autocast(device_type, dtype=dtype)


def grad_scaler(precision: str, device_type: str) -> Any:
    """A ``torch.amp.GradScaler``, enabled only for fp16 (disabled, its calls pass through)."""
    import torch

    return torch.amp.GradScaler(device_type, enabled=precision == "fp16")


def register_comm_hook(ddp: Any, hook: dict[str, Any]) -> None:
    """Register a configuration's communication hook on a DDP module (torch's own hooks):
    ``{name: none|fp16|bf16|powersgd}``, PowerSGD with ``matrix_approximation_rank`` and
    ``start_powerSGD_iter``."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    name = hook["name"]
    if name == "none":
        return
    if name == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif name == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=hook["matrix_approximation_rank"],
            start_powerSGD_iter=hook["start_powerSGD_iter"],
        )
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        raise ValueError(f"unknown comm hook {name!r}")


def wrap(
    model: Any, ddp_kwargs: dict[str, Any], comm_hook: dict[str, Any], **extra_ddp_kwargs: Any
) -> Any:
    """``DistributedDataParallel(model)`` with the configuration's kwargs and its comm hook
    registered. ``extra_ddp_kwargs`` (``device_ids=[local_rank]``) go to DDP too and win over
    the configuration's. ``ddp_kwargs["compile"]``, a ``torch.compile`` mode, is not DDP's: the
    model is compiled first (``compile_model``) and DDP wraps the compiled module, so what is
    returned is a ``DistributedDataParallel`` all the same (``no_sync``, ``module``, hooks).
    The default process group must exist."""
    from torch.nn.parallel import DistributedDataParallel

    kwargs = {**ddp_kwargs, **extra_ddp_kwargs}
    mode = kwargs.pop("compile", compiling.NONE)
    model = compile_model(model, mode, kwargs.get("bucket_cap_mb", DDP_BUCKET_MB))
    ddp = DistributedDataParallel(model, **kwargs)
    register_comm_hook(ddp, comm_hook)
    if not _DRAINING and threading.current_thread() is threading.main_thread():
        _DRAINING.append(True)
        atexit.register(drain_torch_threads)
    return ddp


def compile_model(model: Any, mode: str, bucket_cap_mb: Any = DDP_BUCKET_MB) -> Any:
    """``torch.compile(model, mode=mode, dynamic=False)``, or ``model`` itself for ``none``;
    a mode this process cannot run on the model's device (or with DDP buckets of
    ``bucket_cap_mb``) is a ``ConfigError`` with the reason (``validate.check_compile``).

    Compiled before DDP wraps it, not ``torch.compile(DDP(model))``: in torch 2.13 Dynamo skips
    DDP's own forward, and a model whose forward is torch's own code (``nn.Sequential``, as the
    built-in MLP's) is then never compiled, silently (seen here: no graph captured); wrapped
    the other way every model is. DDP's forward sets the module Dynamo's ``DDPOptimizer`` reads,
    so the graph is still split at DDP's buckets and the all-reduce overlaps the backward.
    ``dynamic=False``: every step has the same shapes (``drop_last``), and a shape that changes
    recompiles rather than turning the graph symbolic. Compilation happens at the first forward
    and backward, in the caller's warm-up."""
    if mode == compiling.NONE:
        return model
    import torch

    first = next(iter(model.parameters()), None)
    device = "cpu" if first is None else first.device.type
    check_compile(mode, device, bucket_cap_mb)
    return torch.compile(model, mode=mode, dynamic=False)


def _torch_thread_running(tasks: str = "/proc/self/task") -> bool:
    """Whether one of the threads torch started (named ``pt_...``: the gloo workers are
    ``pt_gloo_runloop``) is running or runnable. False where there is no ``/proc``."""
    try:
        tids = os.listdir(tasks)
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"{tasks}/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name.startswith("pt_") and stat[stat.rindex(")") + 2 :].startswith("R"):
            return True
    return False


def drain_torch_threads(timeout_s: float = DRAIN_TIMEOUT_S) -> bool:
    """Before the interpreter finalizes (``atexit``, registered by ``wrap``): give torch's
    threads the GIL until none of them runs; whether they went quiet within ``timeout_s``.

    A gloo worker thread lets go of a finished all-reduce after the thread that waited for it
    has moved on: the work holds the contextvars context that the backward stashed in its
    thread-local state, and a comm hook's Python ``then`` callback; releasing either takes the
    GIL. When the main thread has begun finalizing by then, Python ends that thread with
    ``pthread_exit``, whose unwinding through torch's destructor aborts the process ("terminate
    called without an active exception", SIGABRT, exit 1 under torchrun) after a training that
    succeeded. Nothing is waited for when no torch thread runs (three looks, 2 ms apart)."""
    quiet, deadline = 0, time.monotonic() + timeout_s
    while quiet < DRAIN_QUIET_LOOKS:
        time.sleep(0.002)  # the GIL released: a worker waiting for it takes it now
        quiet = 0 if _torch_thread_running() else quiet + 1
        if time.monotonic() > deadline:
            return False
    return True


def dataloader_kwargs(micro_batch: int, data: dict[str, Any]) -> dict[str, Any]:
    """``DataLoader`` kwargs: ``batch_size`` (the micro-batch) and the data section
    (``num_workers``, ``pin_memory``, ``prefetch_factor``, ``persistent_workers``)."""
    return {"batch_size": micro_batch, **data}


def is_last_micro_step(index: int, accumulation_steps: int) -> bool:
    """Whether micro-step ``index`` (counted from 0, within an optimizer step or over the whole
    run) is the last of its optimizer step: the one that all-reduces and steps."""
    return index % accumulation_steps == accumulation_steps - 1


def micro_step(ddp: Any, index: int, accumulation_steps: int) -> AbstractContextManager[Any]:
    """The context for micro-step ``index``'s forward and backward: ``ddp.no_sync()`` on all but
    the last micro-step of an optimizer step, so that gradients are all-reduced once per step."""
    if is_last_micro_step(index, accumulation_steps):
        return nullcontext()
    return ddp.no_sync()
