"""The Lightning callback of a profile, in a module of its own: it imports Lightning at the
top (a ``Callback`` subclass needs its base class), and ``autotune.adapters.lightning``
imports it only when ``callbacks()`` is called."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning.pytorch.callbacks import Callback

from autotune.adapters.common import torch_hook
from autotune.core import apply, compat

if TYPE_CHECKING:
    from autotune.profile.profile import Profile

__all__ = ["AutotuneProfile"]


class AutotuneProfile(Callback):
    """What ``DDPStrategy`` and ``Trainer`` arguments cannot do everywhere:

    * ``setup``: TF32 matmuls on for the ``tf32`` precision (``autotune.core.apply.set_tf32``,
      as a trial sets it);
    * ``on_fit_start`` (after the strategy wrapped the model, before the first step): the
      profile's comm hook registered on the ``DistributedDataParallel`` module when it has none
      yet. ``DDPStrategy`` registers its ``ddp_comm_hook`` only on a CUDA device; on a CPU
      (gloo) this is where the hook comes from. A hook already there (Lightning's, or one of
      your own) is left alone."""

    def __init__(self, profile: Profile) -> None:
        self.precision = profile.precision
        self.hook = dict(profile.ddp["comm_hook"])
        self._profile = profile
        self.registered = False
        """Whether this callback registered the hook (False where Lightning did)."""

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.precision == "tf32":
            apply.set_tf32(True)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel

        model = trainer.strategy.model
        if self.hook["name"] == "none" or not isinstance(model, DistributedDataParallel):
            return
        if compat.ddp_logging(model).get("comm_hook"):
            return
        hook = torch_hook(self._profile)
        if hook is not None:
            model.register_comm_hook(*hook)
            self.registered = True
