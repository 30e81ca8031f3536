"""The workload contract: what a trainer gives autotune, and how a trainer is found.

A trainer is a function that takes keyword options and returns a ``Workload``::

    def workload(*, width: int = 2048, global_batch: int = 128) -> autotune.Workload:
        return autotune.Workload(
            model=lambda: MyNet(width),            # called once per rank, after seeding
            dataset=MyDataset(),                   # map-style; items are (input, target)
            loss=torch.nn.functional.mse_loss,     # loss(model(input), target) -> scalar
            optimizer=lambda params: torch.optim.Adam(params, lr=1e-3),
            global_batch=global_batch,             # samples per optimizer step, all ranks
        )

``--trainer mlp`` names a built-in trainer (``autotune.trainers.mlp:workload``);
``--trainer package.module:function`` names your own. The function is called once in the
driver, to check the contract before any trial starts, and once in every rank.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from autotune.core.errors import ConfigError

__all__ = ["Workload", "available_trainers", "load_workload"]


@dataclass(kw_only=True)
class Workload:
    """What one DDP training job consists of."""

    model: Callable[[], Any]
    """Builds the ``torch.nn.Module`` (on CPU; autotune moves it to the rank's device)."""
    dataset: Any
    """A map-style ``torch.utils.data.Dataset`` whose items are ``(input, target)``."""
    loss: Callable[[Any, Any], Any]
    """``loss(model(input), target)`` -> scalar tensor."""
    optimizer: Callable[[Any], Any]
    """``optimizer(parameters)`` -> ``torch.optim.Optimizer``."""
    global_batch: int
    """Samples per optimizer step summed over ranks; kept fixed for every trial."""
    tokens_per_sample: int | None = None
    """Tokens in one sample, for language models: trials then record ``tokens_per_s`` too."""
    description: str = ""
    """One line for ``autotune trainers``."""


BUILTIN_PACKAGE = "autotune.trainers"


#: The directory of a user's trainer module, for the ranks (``_with_cwd_on_path``).
TRAINER_DIR_ENV = "AUTOTUNE_TRAINER_DIR"


def available_trainers() -> dict[str, str]:
    """Built-in trainer name -> first line of its module docstring."""
    pkg = importlib.import_module(BUILTIN_PACKAGE)
    out = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("_"):
            mod = importlib.import_module(f"{BUILTIN_PACKAGE}.{info.name}")
            out[info.name] = (mod.__doc__ or "").strip().splitlines()[0] if mod.__doc__ else ""
    return out


def _with_cwd_on_path() -> None:
    """Make the user's trainer module importable from the directory ``autotune run`` was typed
    in, as ``python -m`` and ``torchrun train.py`` do: the installed ``autotune`` command does
    not put it on ``sys.path``. It goes last, so a file there never shadows an installed
    package; the ranks get the same directory in ``TRAINER_DIR_ENV`` (``cluster.connect``),
    never on ``PYTHONPATH``, which would put it before site-packages at their start."""
    import os
    import sys

    where = os.environ.get(TRAINER_DIR_ENV) or os.getcwd()
    if where not in sys.path and "" not in sys.path:
        sys.path.append(where)


def resolve_trainer(ref: str) -> Callable[..., Workload]:
    """``mlp`` or ``package.module:function`` -> the trainer function."""
    if ":" in ref:
        module_name, _, attr = ref.partition(":")
        if (
            not module_name
            or not attr
            or not all(part.isidentifier() for part in [*module_name.split("."), attr])
        ):
            raise ConfigError(
                f"--trainer {ref!r}: expected a built-in trainer name or package.module:function "
                f"(e.g. my_model:workload)"
            )
    else:
        module_name, attr = f"{BUILTIN_PACKAGE}.{ref}", "workload"
        if ref not in available_trainers():
            raise ConfigError(
                f"--trainer: unknown trainer {ref!r}; choose one of "
                f"{', '.join(available_trainers())} or give package.module:function"
            )
    if ":" in ref:
        _with_cwd_on_path()
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(
            f"--trainer {ref}: cannot import {module_name} ({e}); install it or run from the "
            f"directory that contains it"
        ) from None
    except Exception as e:  # a syntax error, or the module's own code raising on import
        raise ConfigError(
            f"--trainer {ref}: importing {module_name} raised {_one_line(e)}; fix the module"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"--trainer {ref}: {module_name} has no function {attr!r}")
    return fn


def _one_line(e: BaseException) -> str:
    """``Type: first line of the message`` (a SyntaxError with its file and line)."""
    if isinstance(e, SyntaxError):
        return f"SyntaxError: {e.msg} ({e.filename}, line {e.lineno})"
    first = next((line for line in str(e).splitlines() if line.strip()), "")
    return f"{type(e).__name__}: {first[:200]}" if first else type(e).__name__


def load_workload(ref: str, options: Mapping[str, Any] | None = None) -> Workload:
    """Call the trainer with ``options`` and check what it returns against the contract."""
    fn = resolve_trainer(ref)
    options = dict(options or {})
    try:
        inspect.signature(fn).bind(**options)
    except TypeError as e:
        raise ConfigError(f"--trainer {ref}: the trainer refused its options: {e}") from None
    except ValueError:  # no signature to check (a builtin): the call below says it
        pass
    try:
        wl = fn(**options)
    except TypeError as e:  # e.g. Workload(...) without a required field
        raise ConfigError(f"--trainer {ref}: {e}; see the Workload contract") from None
    except Exception as e:  # the trainer function's own code raised
        raise ConfigError(
            f"--trainer {ref}: the trainer function raised {_one_line(e)}; fix it or its "
            f"--trainer-option values"
        ) from None
    if not isinstance(wl, Workload):
        raise ConfigError(
            f"--trainer {ref}: returned {type(wl).__name__}, expected autotune.Workload"
        )
    for name in ("model", "loss", "optimizer"):
        if not callable(getattr(wl, name)):
            raise ConfigError(f"--trainer {ref}: Workload.{name} must be callable")
    if not hasattr(wl.dataset, "__getitem__") or not hasattr(wl.dataset, "__len__"):
        raise ConfigError(f"--trainer {ref}: Workload.dataset must be a map-style Dataset")
    if (
        isinstance(wl.global_batch, bool)
        or not isinstance(wl.global_batch, int)
        or (wl.global_batch < 1)
    ):
        raise ConfigError(f"--trainer {ref}: Workload.global_batch must be a positive integer")
    tps = wl.tokens_per_sample
    if tps is not None and (isinstance(tps, bool) or not isinstance(tps, int) or tps < 1):
        raise ConfigError(
            f"--trainer {ref}: Workload.tokens_per_sample must be a positive integer or None"
        )
    return wl
