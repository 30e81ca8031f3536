"""Framework adapters: a profile's settings as the arguments of Lightning, Hugging Face
Accelerate and the Hugging Face ``Trainer`` (docs/frameworks.md).

* ``autotune.adapters.lightning``: ``ddp_strategy``, ``trainer_kwargs``, ``dataloader_kwargs``;
* ``autotune.adapters.accelerate``: ``kwargs_handlers``, ``accelerator_kwargs``,
  ``dataloader_kwargs``;
* ``autotune.adapters.hf``: ``training_arguments_kwargs``, ``set_ddp_kwargs``.

Each has ``mapping(profile)``: which knobs its arguments carry and, for the others, why none
does and how to apply them anyway. The environment (NCCL variables, ``OMP_NUM_THREADS``,
glibc's allocator pin) is no framework's argument: it travels by ``autotune launch`` or
``autotune env``. ``render(profile, fmt)`` is the snippet ``autotune export --format`` prints.

Importing this package imports no framework (nor torch, Optuna or Ray): each function imports
what it needs when called.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from autotune.adapters.common import Mapping
from autotune.core.errors import ConfigError

if TYPE_CHECKING:
    from autotune.profile.profile import Profile

__all__ = ["FORMATS", "Mapping", "mapping", "render"]

#: ``autotune export --format`` -> the adapter module that renders it.
FORMATS = {"lightning": "lightning", "accelerate": "accelerate", "hf-trainer": "hf"}


def _module(fmt: str) -> ModuleType:
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: not one of {', '.join(FORMATS)}")
    return importlib.import_module(f"autotune.adapters.{FORMATS[fmt]}")


def mapping(profile: Profile, fmt: str) -> Mapping:
    """Which of ``profile``'s knobs the framework ``fmt`` (one of ``FORMATS``) carries."""
    return _module(fmt).mapping(profile)


def render(profile: Profile, fmt: str) -> str:
    """The Python snippet that applies ``profile`` in the framework ``fmt`` (one of
    ``FORMATS``): its values written out, the knobs no argument carries and the
    ``autotune launch`` line for the environment as comments. It imports nothing of the
    framework; a ConfigError names an unknown ``fmt``."""
    return _module(fmt).snippet(profile)
