"""What a knob is: one tunable setting, its default and its legality rules (``Knob``). The
catalogue of knobs is ``core.knobs``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from autotune.core.target import Target

__all__ = ["Knob"]


def _no_drop(t: Target) -> str | None:
    return None


def _no_choice_drop(t: Target, v: Any) -> str | None:
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class Knob:
    """One tunable setting."""

    name: str
    """Its name in the space YAML, the Optuna study and the profile."""
    section: str
    """Section of the space YAML and of the profile it belongs to."""
    doc: str
    """One line on what it does, shown by ``autotune spaces``."""
    default: Any
    """The value nobody sets (PyTorch/NCCL/torchrun defaults); a callable of the Target."""
    legal: Callable[[Any], str | None]
    """Why a single value is illegal, or None."""
    drop: Callable[[Target], str | None] = _no_drop
    """Why the whole knob cannot act on a target, or None."""
    drop_choice: Callable[[Target, Any], str | None] = _no_choice_drop
    """Why one value cannot act on a target, or None."""
    parent: tuple[str, Callable[[Any, Target], bool]] | None = None
    """(knob, predicate): suggested only when ``predicate(that knob's value, target)`` holds;
    the parent must come earlier in KNOBS."""
    choices_only: bool = False
    """Only a ``categorical`` distribution can describe it (flags, names, NCCL's 'default')."""

    def default_for(self, target: Target) -> Any:
        return self.default(target) if callable(self.default) else self.default
