"""The only module that touches private Optuna, Ray or torch API, each use named with why no public
API does the job. ``pyproject.toml`` bounds both packages from above, and
``tests/unit/test_compat.py`` fails loudly when this surface moves.

* ``STUDY_TRIALS_METHOD``: Optuna's samplers read a study's trials through the private
  ``Study._get_trials`` (public ``get_trials`` is a wrapper without ``use_cache``). A sampler
  that shows its model other trials (``samplers.FailureAwareTPESampler``) must override that
  very method on a view of the study; Optuna offers no public hook for "which trials a sampler
  sees".
* ``bootstrap_address("auto")``: where ``ray.init(address="auto")`` would connect (``RAY_ADDRESS``
  or the cluster recorded by ``ray start`` on this machine). Ray has no public call for it, and
  ``ray.init`` itself retries for minutes when nothing answers there; autotune asks first, to
  fail in seconds with a one-line error.
* ``loopback_node_ip()``: while a local Ray instance starts, its node IP is 127.0.0.1, so that
  Ray's servers (GCS, raylet, object manager, every worker's and the driver's gRPC server, its
  agents) listen on loopback only: Ray binds its gRPC servers to 127.0.0.1 exactly when the
  node IP is 127.0.0.1, else to every interface. No public option sets it: ``ray.init``'s
  ``_node_ip_address`` is private too and maps 127.0.0.1 back to the machine's outward address
  (``resolve_ip_for_localhost``); Ray keeps loopback only where
  ``ray_constants.ENABLE_RAY_CLUSTER`` is false (its default on macOS and Windows), which its
  public variable ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` sets only when present before Ray is
  first imported. The flag is set for the duration of ``ray.init`` and restored after it.
* ``ddp_logging(ddp)``: ``DistributedDataParallel._get_ddp_logging_data()``, the record DDP
  keeps of itself: the comm hook it runs (a registered hook has no public getter) and the
  bucket sizes it settled on after its first steps (``rebuilt_bucket_sizes``; DDP computes
  them from the order gradients became ready, which no public call returns). The limit probe
  all-reduces buckets of exactly those sizes.
* ``ray_off_main_thread_quiet()``: ``ray.init`` called off the main thread (``autotune run``
  starts Ray on a thread of its own, so that a signal cannot leave it half-built) logs, through
  the logger of its private module ``ray._private.worker``, that it set no SIGTERM handler:
  autotune sets its own on purpose. No public option silences that one line; a filter on that
  logger drops exactly it while the call runs.
* ``reread_ray_config()``: Ray reads its public variable ``RAY_AUTH_MODE`` into the process's
  config once, when it is first imported; a driver that sets it later (a local instance's
  token authentication, set explicitly so that Ray does not warn it turned it on by default)
  has Ray read it again with ``ray._raylet.Config.initialize("")``, as ``ray.init`` itself
  does where it turns token authentication on. Ray has no public call for it.
* ``compiled_graphs()``: the graphs Dynamo has captured in this process
  (``torch._dynamo.utils.counters["stats"]["unique_graphs"]``, recompiles included). A rank
  reads it before and after a compiled trial's steps, to say that the model was compiled and
  that nothing compiled inside the timed windows; ``torch.compiler`` has no public counter.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Container, Iterator
from typing import Any

__all__ = [
    "STUDY_TRIALS_METHOD",
    "bootstrap_address",
    "call_study_trials",
    "compiled_graphs",
    "ddp_bucket_bytes",
    "ddp_logging",
    "loopback_node_ip",
    "ray_off_main_thread_quiet",
    "reread_ray_config",
]

#: The logger of Ray's module that warns, off the main thread, that it set no SIGTERM handler.
RAY_WORKER_LOGGER = "ray._private.worker"

#: The private method through which Optuna's samplers read a study's trials.
STUDY_TRIALS_METHOD = "_get_trials"


def call_study_trials(
    study: Any, *, deepcopy: bool, states: Container[Any] | None, use_cache: bool
) -> list[Any]:
    """``study._get_trials(...)``: the trials as Optuna's samplers read them."""
    return getattr(study, STUDY_TRIALS_METHOD)(
        deepcopy=deepcopy, states=states, use_cache=use_cache
    )


def bootstrap_address(address: str) -> str | None:
    """The ``HOST:PORT`` that ``ray.init(address=address)`` would connect to; None when
    ``auto`` finds no cluster on this machine."""
    import ray._private.services as services

    try:
        return services.canonicalize_bootstrap_address(address) or None
    except Exception:
        return None


@contextlib.contextmanager
def loopback_node_ip() -> Iterator[None]:
    """While it lasts, Ray takes 127.0.0.1 as this node's IP (``ray.init(address="local")``
    started inside it listens on loopback only)."""
    import ray._private.ray_constants as ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


@contextlib.contextmanager
def ray_off_main_thread_quiet() -> Iterator[None]:
    """While it lasts, Ray's "SIGTERM handler is not set" warning is not logged."""
    worker_log = logging.getLogger(RAY_WORKER_LOGGER)

    def keep(record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()

    worker_log.addFilter(keep)
    try:
        yield
    finally:
        worker_log.removeFilter(keep)


def reread_ray_config() -> None:
    """Ray reads its configuration from the environment again (``RAY_AUTH_MODE`` among it)."""
    from ray._raylet import Config

    Config.initialize("")


def ddp_logging(ddp: Any) -> dict[str, Any]:
    """DDP's record of itself (``_get_ddp_logging_data``): ``comm_hook``, the bucket sizes."""
    return dict(ddp._get_ddp_logging_data())


def ddp_bucket_bytes(ddp: Any) -> list[int]:
    """The sizes in bytes of ``ddp``'s gradient buckets, in the order it all-reduces them:
    those it rebuilt after its first backward when it did, else those it started with."""
    data = ddp_logging(ddp)
    sizes = data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or ""
    return [int(b) for b in str(sizes).replace(",", " ").split()]


def compiled_graphs() -> int | None:
    """Graphs Dynamo captured in this process so far (module doc); None where the counter is
    not there (another torch)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    value = counters.get("stats", {}).get("unique_graphs", 0)
    return int(value) if isinstance(value, int) else None
