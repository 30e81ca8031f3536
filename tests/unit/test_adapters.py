"""The framework adapters (``autotune.adapters``): every knob mapped or listed unmapped in each
framework, the exact arguments each builds (checked against the real libraries' classes), the
batch arithmetic at a fixed global batch, and the snippets ``render`` prints (they compile, and
the values they write out are the adapters' own). Real 2-rank runs:
tests/integration/test_adapters.py."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from autotune import adapters
from autotune.adapters import accelerate as acc
from autotune.adapters import common, hf
from autotune.adapters import lightning as light
from autotune.core import allocator
from autotune.core.config import POWERSGD_START_ITER, TrialConfig
from autotune.core.errors import ConfigError
from autotune.core.knobs import KNOBS
from autotune.core.target import Target
from autotune.definition.space import SearchSpace
from autotune.profile.profile import Profile
from tests.conftest import REPO

CPU = Target(
    backend="gloo", device="cpu", world_size=2, global_batch=64, cpus_per_rank=4, bf16=True
)
GPU = Target(
    backend="nccl",
    device="cuda",
    world_size=4,
    global_batch=256,
    cpus_per_rank=8,
    bf16=True,
    tf32=True,
)
MIB = 2**20


def make(target: Target = CPU, **changes) -> Profile:
    values = {**SearchSpace.load("default").resolve(target).defaults(), **changes}
    return Profile.from_config(
        TrialConfig.from_values(values, target),
        study={"name": "s", "best_trial": 3, "baseline_trial": 0},
        workload={
            "trainer": "mlp",
            "options": {},
            "world_size": target.world_size,
            "backend": target.backend,
            "global_batch": target.global_batch,
        },
        hardware={"device": target.device},
        measured={"baseline_samples_per_s": 1.0, "best_samples_per_s": 2.0, "speedup": 2.0},
    )


#: Profiles that between them move every knob off its default.
PROFILES = {
    "defaults": make(),
    "cpu-tuned": make(
        micro_batch=8,
        bucket_cap_mb=5.0,
        gradient_as_bucket_view=True,
        comm_hook="fp16",
        num_workers=2,
        prefetch_factor=4,
        persistent_workers=True,
        precision="bf16",
        threads=2,
        compile="default",
    ),
    "gpu-powersgd": make(
        GPU,
        comm_hook="powersgd",
        powersgd_rank=4,
        pin_memory=True,
        precision="tf32",
        NCCL_ALGO="Ring",
        NCCL_PROTO="LL128",
    ),
    "gpu-static": make(
        GPU,
        static_graph=True,
        comm_hook="bf16",
        precision="fp16",
        NCCL_BUFFSIZE=8388608,
        NCCL_NTHREADS=256,
    ),
}


# -- every knob classified ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", sorted(adapters.FORMATS))
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_knob_is_mapped_or_listed_unmapped_with_a_reason(fmt, name):
    m = adapters.mapping(PROFILES[name], fmt)
    for knob in KNOBS:  # a new knob fails here until each adapter classifies it
        assert (knob in m.mapped) != (knob in m.unmapped), (fmt, knob)
        assert (m.mapped.get(knob) or m.unmapped.get(knob)).strip(), (fmt, knob)
    assert set(m.mapped) | set(m.unmapped) == set(KNOBS)
    assert m.unclassified() == []


@pytest.mark.parametrize("fmt", sorted(adapters.FORMATS))
def test_the_environment_knobs_are_unmapped_everywhere_and_travel_by_launch(fmt):
    m = adapters.mapping(PROFILES["gpu-powersgd"], fmt)
    env = [k for k in KNOBS if KNOBS[k].section in ("nccl", "cpu")]
    assert env and all(k in m.unmapped for k in env)
    assert all("autotune launch" in m.unmapped[k] for k in env)
    assert common.env_knobs()["threads"] == "OMP_NUM_THREADS"


def test_what_each_framework_cannot_carry():
    def own(name: str, fmt: str) -> set[str]:
        m = adapters.mapping(PROFILES[name], fmt)
        return {k for k in m.unmapped if k not in common.env_knobs()}

    # TF32 and PowerSGD
    assert {fmt: own("gpu-powersgd", fmt) for fmt in adapters.FORMATS} == {
        "lightning": set(),
        "accelerate": {"precision"},  # no TF32 switch
        "hf-trainer": {"gradient_as_bucket_view", "comm_hook", "powersgd_rank"},
    }
    # torch.compile: autotune compiled the model before DDP wrapped it; no argument does
    assert {fmt: own("cpu-tuned", fmt) for fmt in adapters.FORMATS} == {
        "lightning": {"compile"},
        "accelerate": {"compile"},
        "hf-trainer": {"gradient_as_bucket_view", "comm_hook", "powersgd_rank", "compile"},
    }
    assert "compile" in adapters.mapping(PROFILES["defaults"], "lightning").mapped
    assert "precision" in adapters.mapping(PROFILES["cpu-tuned"], "accelerate").mapped
    hook = adapters.mapping(PROFILES["cpu-tuned"], "hf-trainer").unmapped["comm_hook"]
    assert "set_ddp_kwargs" in hook and "fp16_compress_hook" in hook


def test_a_mapping_refuses_a_knob_both_mapped_and_unmapped():
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        common.Mapping.of("X", {"bucket_cap_mb": "a"}, {"bucket_cap_mb": "b"})
    with pytest.raises(ValueError, match="NCCL_ALGO"):
        common.Mapping.of("X", {"NCCL_ALGO": "a"}, {})


# -- the batch at a fixed global batch ------------------------------------------------------


def test_micro_batch_and_accumulation_keep_the_global_batch():
    p = PROFILES["cpu-tuned"]  # 64 over 2 ranks, micro-batch 8: 4 accumulation steps
    assert common.batch(p) == (8, 4)
    assert common.batch(p, world_size=4) == (8, 2)  # still 8 x 2 x 4 = 64
    assert common.batch(p, world_size=8) == (8, 1)
    with pytest.raises(ConfigError, match="not a whole number of micro-batches"):
        common.batch(p, world_size=3)
    with pytest.raises(ConfigError, match="world_size"):
        common.batch(p, world_size=0)
    assert light.trainer_kwargs(p, world_size=4)["accumulate_grad_batches"] == 2
    assert hf.training_arguments_kwargs(p, world_size=4)["gradient_accumulation_steps"] == 2


def test_static_graph_cannot_gain_accumulation_on_fewer_ranks():
    p = PROFILES["gpu-static"]  # 256 on 4 ranks, micro-batch 64, no accumulation
    assert common.batch(p) == (64, 1)
    with pytest.raises(ConfigError, match="static_graph"):
        common.batch(p, world_size=2)


def test_a_free_batch_profile_keeps_its_per_rank_settings_on_any_world_size():
    p = PROFILES["cpu-tuned"]
    p.workload["free_batch"] = True
    try:
        assert common.batch(p, world_size=3) == (8, 4)
    finally:
        del p.workload["free_batch"]


# -- the arguments, against the real classes -------------------------------------------------


def test_lightning_strategy_and_trainer_arguments():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    p = PROFILES["cpu-tuned"]
    kw = light.strategy_kwargs(p)
    assert kw == {
        "bucket_cap_mb": 5.0,
        "gradient_as_bucket_view": True,
        "static_graph": False,
        "ddp_comm_state": None,
        "ddp_comm_hook": default_hooks.fp16_compress_hook,
    }
    ps = light.strategy_kwargs(PROFILES["gpu-powersgd"])
    assert ps["ddp_comm_hook"] is powerSGD_hook.powerSGD_hook
    assert ps["ddp_comm_state"].matrix_approximation_rank == 4
    assert ps["ddp_comm_state"].start_powerSGD_iter == POWERSGD_START_ITER
    assert "ddp_comm_hook" not in light.strategy_kwargs(PROFILES["defaults"])
    assert {n: light.trainer_kwargs(PROFILES[n])["precision"] for n in PROFILES} == {
        "defaults": "32-true",
        "cpu-tuned": "bf16-mixed",
        "gpu-powersgd": "32-true",
        "gpu-static": "16-mixed",
    }
    assert light.trainer_kwargs(p)["accumulate_grad_batches"] == 4


def test_lightning_builds_a_real_strategy_and_callback():
    pytest.importorskip("lightning", reason="lightning is not installed (the test extra)")
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.strategies import DDPStrategy

    p = PROFILES["cpu-tuned"]
    strategy = light.ddp_strategy(p, process_group_backend="gloo")
    assert isinstance(strategy, DDPStrategy) and strategy.process_group_backend == "gloo"
    (cb,) = light.trainer_kwargs(p)["callbacks"]
    assert isinstance(cb, Callback) and cb.hook == {"name": "fp16"} and not cb.registered


def test_accelerate_ddp_kwargs_register_the_profiles_hook_on_a_real_ddp_module():
    pytest.importorskip("accelerate", reason="accelerate is not installed (the test extra)")
    import torch
    import torch.distributed as dist
    from accelerate.utils import DDPCommunicationHookType

    from autotune.core import compat

    p = PROFILES["gpu-powersgd"]
    (handler,) = acc.kwargs_handlers(p)
    assert handler.comm_hook is DDPCommunicationHookType.POWER_SGD
    assert handler.comm_state_option == {
        "matrix_approximation_rank": 4,
        "start_powerSGD_iter": POWERSGD_START_ITER,
    }
    kw = acc.accelerator_kwargs(PROFILES["cpu-tuned"])
    assert (kw["mixed_precision"], kw["gradient_accumulation_steps"]) == ("bf16", 4)
    (tuned,) = kw["kwargs_handlers"]
    assert tuned.to_kwargs() == {"bucket_cap_mb": 5.0, "gradient_as_bucket_view": True}
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:  # what Accelerator.prepare does with the handler
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4), **tuned.to_kwargs())
        tuned.register_comm_hook(ddp)
        assert ddp.bucket_bytes_cap == 5 * MIB and ddp.gradient_as_bucket_view
        assert compat.ddp_logging(ddp)["comm_hook"] == "fp16_compress_hook"
        powersgd = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        handler.register_comm_hook(powersgd)  # registered only: PowerSGD cannot run on gloo
        assert compat.ddp_logging(powersgd)["comm_hook"] == "powerSGD_hook"
    finally:
        dist.destroy_process_group()


def test_hf_training_arguments_are_real_fields_with_the_profiles_values(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed (the test extra)")
    from transformers import TrainingArguments

    p = PROFILES["cpu-tuned"]
    kw = hf.training_arguments_kwargs(p)
    assert kw == {
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 4,
        "ddp_bucket_cap_mb": 5,
        "ddp_static_graph": False,
        "ddp_find_unused_parameters": False,
        "dataloader_num_workers": 2,
        "dataloader_pin_memory": False,
        "dataloader_prefetch_factor": 4,
        "dataloader_persistent_workers": True,
        "bf16": True,
        "fp16": False,
    }
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)
    assert {k: getattr(args, k) for k in kw} == kw
    assert hf.training_arguments_kwargs(PROFILES["gpu-powersgd"])["tf32"] is True
    static = hf.training_arguments_kwargs(PROFILES["gpu-static"])
    assert static["ddp_static_graph"] and static["fp16"] and "tf32" not in static
    assert "dataloader_prefetch_factor" not in hf.training_arguments_kwargs(PROFILES["defaults"])


def test_a_fractional_bucket_size_stays_fractional():
    p = make(bucket_cap_mb=12.5)
    assert hf.training_arguments_kwargs(p)["ddp_bucket_cap_mb"] == 12.5
    assert light.strategy_kwargs(p)["bucket_cap_mb"] == 12.5


# -- the snippets ------------------------------------------------------------------------------


def calls(text: str) -> dict[str, dict[str, str]]:
    """Each call ``Name(...)`` of a snippet, by name: its keyword arguments as source text."""
    out = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            out[node.func.id] = {k.arg: ast.unparse(k.value) for k in node.keywords if k.arg}
    return out


@pytest.mark.parametrize("fmt", sorted(adapters.FORMATS))
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_a_snippet_compiles_and_says_how_the_environment_and_the_rest_travel(fmt, name):
    p = PROFILES[name]
    text = adapters.render(p, fmt)
    compile(text, f"<{fmt}>", "exec")
    assert "autotune launch best.yaml -- " in text and 'eval "$(autotune env best.yaml)"' in text
    for var, value in p.env.items():
        assert f"{var}={value}" in text
    assert set(allocator.ENV) <= set(p.env)  # the pin travels with the environment
    for knob in adapters.mapping(p, fmt).unmapped:
        assert f"{knob}" in text
    assert all(len(line) <= 100 for line in text.splitlines() if line.startswith("#"))


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_the_snippets_write_out_the_adapters_own_values(name):
    p = PROFILES[name]
    lit = ast.literal_eval
    strategy = calls(adapters.render(p, "lightning"))
    kw = light.strategy_kwargs(p)
    assert {k: lit(strategy["DDPStrategy"][k]) for k in common.DDP_KNOBS} == p.ddp_kwargs
    assert ("ddp_comm_hook" in strategy["DDPStrategy"]) == ("ddp_comm_hook" in kw)
    trainer = {k: lit(v) for k, v in strategy["Trainer"].items() if k != "strategy"}
    assert trainer == {k: v for k, v in light.trainer_kwargs(p).items() if k != "callbacks"}
    loader = {k: lit(v) for k, v in strategy["DataLoader"].items() if k != "shuffle"}
    assert loader == light.dataloader_kwargs(p)
    a = calls(adapters.render(p, "accelerate"))
    ddp = {k: v for k, v in a["DistributedDataParallelKwargs"].items() if k != "comm_hook"}
    expected = acc.ddp_kwargs(p)
    assert a["DistributedDataParallelKwargs"]["comm_hook"].endswith(expected.pop("comm_hook"))
    assert {k: lit(v) for k, v in ddp.items()} == expected
    assert lit(a["Accelerator"]["gradient_accumulation_steps"]) == common.batch(p)[1]
    args = calls(adapters.render(p, "hf-trainer"))["TrainingArguments"]
    args.pop("output_dir")
    assert {k: lit(v) for k, v in args.items()} == hf.training_arguments_kwargs(p)


def test_the_lightning_snippet_runs_and_builds_what_the_adapter_builds():
    pytest.importorskip("lightning", reason="lightning is not installed (the test extra)")
    import torch
    from torch.utils.data import TensorDataset

    p = PROFILES["cpu-tuned"]
    ns = {"dataset": TensorDataset(torch.zeros(64, 2))}
    exec(adapters.render(p, "lightning"), ns)
    assert ns["trainer"].accumulate_grad_batches == 4
    loader = ns["train_loader"]
    got = {k: getattr(loader, k) for k in light.dataloader_kwargs(p)}
    assert got == light.dataloader_kwargs(p)


def test_render_refuses_an_unknown_format():
    with pytest.raises(ConfigError, match="lightning, accelerate, hf-trainer"):
        adapters.render(PROFILES["defaults"], "keras")
    assert list(adapters.FORMATS) == ["lightning", "accelerate", "hf-trainer"]


def test_importing_the_adapters_and_rendering_import_no_framework_nor_the_tuner(tmp_path):
    path = PROFILES["gpu-powersgd"].save(tmp_path / "best.yaml")
    code = (
        "import sys, json\n"
        "import autotune.adapters, autotune.adapters.lightning, autotune.adapters.accelerate\n"
        "import autotune.adapters.hf\n"
        "from autotune import Profile\n"
        f"profile = Profile.load({str(path)!r})\n"
        "texts = [autotune.adapters.render(profile, f) for f in autotune.adapters.FORMATS]\n"
        "heavy = ('lightning', 'accelerate', 'transformers', 'optuna', 'ray')\n"
        "print(json.dumps(sorted(m for m in heavy if m in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == []


def test_export_from_a_profile_file_prints_or_writes_the_frameworks_snippet(tmp_path):
    """`autotune export --format F --from PROFILE`: the snippet of a profile someone sent, no
    study needed; `--from` without `--format` is one line, exit 2, nothing written."""
    from tests.conftest import in_process

    profile = make(bucket_cap_mb=50).save(tmp_path / "sent.yaml")
    ran = in_process("export", "--format", "hf-trainer", "--from", str(profile))
    sent = Profile.load(profile)
    assert ran.returncode == 0 and ran.stdout == adapters.render(sent, "hf-trainer")
    assert "ddp_bucket_cap_mb=50" in ran.stdout
    out = tmp_path / "snippet.py"
    ran = in_process("export", "--format", "lightning", "--from", str(profile), "-o", str(out))
    assert ran.returncode == 0 and out.read_text() == adapters.render(sent, "lightning")
    bad = in_process("export", "--from", str(profile), "-o", str(tmp_path / "x.py"))
    assert bad.returncode == 2 and "--format" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.py").exists()


#: Texts that end a literal or a comment line where they are pasted raw: a newline, a carriage
#: return (Python ends a line there too), Unicode line and paragraph separators, NEL, quotes,
#: a backslash; each followed by code.
HOSTILE_TEXTS = [
    "3)\nimport os; os.system('touch pwned')\n#",
    "3)\rimport os; os.system('touch pwned')\r#",
    "3\u2028import os\u2029os.system('x')",
    "3\x85import os",
    "3'\"\\'; import os #",
]


def _calls_and_imports(text: str) -> tuple[set[str], set[str]]:
    """What a snippet calls (by name) and imports."""
    calls, imports = set(), set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            calls.add(ast.unparse(node.func))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imports |= {a.name for a in node.names} | {getattr(node, "module", None) or ""}
    return calls, imports


@pytest.mark.parametrize("fmt", sorted(adapters.FORMATS))
@pytest.mark.parametrize("text", HOSTILE_TEXTS)
def test_h_p65_no_profile_text_becomes_code_in_a_snippet(fmt, text, tmp_path):
    """H-P65: every string field a profile file may hold, hostile, through the loader: the
    snippet compiles, calls and imports exactly what the clean profile's does, and holds the
    text only as the literal of itself."""
    clean = make()
    path = clean.save(tmp_path / "p.yaml")
    import yaml

    data = yaml.safe_load(path.read_text())
    data["study"].update(name=text, best_trial=text, baseline_trial=text)
    data["measured"]["note"] = text
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    try:
        hostile = Profile.load(path)
    except ConfigError:
        return  # refused at load: nothing is generated
    snippet = adapters.render(hostile, fmt)
    compile(snippet, f"<{fmt}>", "exec")
    assert _calls_and_imports(snippet) == _calls_and_imports(adapters.render(clean, fmt))
    assert all(not line.lstrip().startswith("import os") for line in snippet.splitlines())
    # the text itself (as the loader read it), as a literal in the header's comment
    assert common.literal(hostile.study["best_trial"]) in snippet
