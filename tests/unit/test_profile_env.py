"""Profiles are untrusted input: a profile file, or a study in someone else's database that
``autotune export`` turns into one. Its ``env`` may set only the NCCL knobs and
OMP_NUM_THREADS, each value legal by its knob's rule; the values autotune computes with are
type-checked; ``autotune env`` quotes names and values, checked by ``eval`` in a real bash."""

from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution
from optuna.trial import create_trial

from autotune.core import allocator
from autotune.core.config import TrialConfig
from autotune.core.errors import ConfigError
from autotune.core.knobs import KNOBS, NCCL_ALGOS, NCCL_NTHREADS, NCCL_PROTOS
from autotune.core.target import Target
from autotune.definition.space import SearchSpace, available_spaces
from autotune.profile.profile import ALLOWED_ENV, Profile, check_env, shell_exports
from tests.conftest import Ran, in_process

AUTOTUNE = str(Path(sys.executable).with_name("autotune"))
CPU = Target(backend="gloo", device="cpu", world_size=2, global_batch=64, cpus_per_rank=1)
GPU = Target(
    backend="nccl",
    device="cuda",
    world_size=4,
    global_batch=256,
    cpus_per_rank=8,
    bf16=True,
    tf32=True,
)
WORKLOAD = {"trainer": "mlp", "options": {}, "world_size": 2, "backend": "gloo", "global_batch": 64}
HARDWARE = {
    "device": "cpu",
    "device_name": "cpu",
    "device_count": 2,
    "node_count": 1,
    "torch": "2.13.0",
    "nccl": None,
}
MEASURED = {"baseline_samples_per_s": 1.0, "best_samples_per_s": 2.0, "speedup": 2.0}


def config(**changes) -> TrialConfig:
    values = {**SearchSpace.load("default").resolve(CPU).defaults(), **changes}
    return TrialConfig.from_values(values, CPU)


def profile(cfg: TrialConfig | None = None, target: Target = CPU) -> Profile:
    return Profile.from_config(
        cfg or config(),
        study={"name": "s", "best_trial": 3, "baseline_trial": 0},
        workload={
            **WORKLOAD,
            "world_size": target.world_size,
            "backend": target.backend,
            "global_batch": target.global_batch,
        },
        hardware=dict(HARDWARE),
        measured=dict(MEASURED),
    )


def write(path: Path, edit=None) -> Path:
    data = profile(config(comm_hook="fp16")).to_mapping()
    if edit is not None:
        edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def env(**variables):
    return lambda d: d["env"].update(variables)


def section(name, **values):
    return lambda d: d[name].update(values)


def run(*args: str, cwd: Path | None = None) -> Ran:
    """``autotune ARGS`` in this process (``tests.conftest.in_process``: exec'ing a command there
    fails the test); ``autotune launch`` exec'ing its command runs the console script below."""
    return in_process(*args, cwd=cwd)


def bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "OMP_"))}
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, cwd=cwd, env=clean, timeout=30
    )


HOSTILE = [
    # names: only the NCCL knobs and OMP_NUM_THREADS
    pytest.param(env(**{"X;touch p": "1"}), "env key 'X;touch p' is not allowed", id="H-P01"),
    pytest.param(env(**{"A=$(touch p)": "1"}), "env key 'A=$(touch p)' is not allowed", id="H-P02"),
    pytest.param(
        env(**{"NCCL_ALGO\nX": "Ring"}), "env key 'NCCL_ALGO\\nX' is not allowed", id="H-P03"
    ),
    pytest.param(env(LD_PRELOAD="/tmp/evil.so"), "env key 'LD_PRELOAD' is not allowed", id="H-P04"),
    pytest.param(env(PYTHONPATH="/tmp/evil"), "env key 'PYTHONPATH' is not allowed", id="H-P05"),
    pytest.param(env(PATH="/tmp/evil:/usr/bin"), "env key 'PATH' is not allowed", id="H-P06"),
    pytest.param(
        env(NCCL_SOCKET_IFNAME="eth0"), "env key 'NCCL_SOCKET_IFNAME' is not allowed", id="H-P07"
    ),
    pytest.param(lambda d: d["env"].update({1: "1"}), "env key 1 is not allowed", id="H-P08"),
    # values: each knob's own legality rule
    pytest.param(env(NCCL_ALGO="foo"), "env.NCCL_ALGO must be one of Ring, Tree", id="H-P09"),
    pytest.param(env(NCCL_ALGO="Ring; touch p"), "env.NCCL_ALGO must be one of", id="H-P10"),
    pytest.param(env(NCCL_ALGO="default"), "env.NCCL_ALGO must not be 'default'", id="H-P11"),
    pytest.param(
        env(NCCL_PROTO="$(touch p)"), "env.NCCL_PROTO must be one of LL, LL128, Simple", id="H-P12"
    ),
    pytest.param(
        env(NCCL_BUFFSIZE="`touch p`"),
        "env.NCCL_BUFFSIZE must be an integer in [1, 1073741824]",
        id="H-P13",
    ),
    pytest.param(
        env(NCCL_BUFFSIZE="0"),
        "env.NCCL_BUFFSIZE must be an integer in [1, 1073741824]",
        id="H-P14",
    ),
    pytest.param(
        env(NCCL_BUFFSIZE="9" * 5000),
        "env.NCCL_BUFFSIZE must be an integer in [1, 1073741824]",
        id="H-P15",
    ),
    pytest.param(
        env(NCCL_NTHREADS="100"), "env.NCCL_NTHREADS must be one of 64, 128, 256, 512", id="H-P16"
    ),
    pytest.param(
        env(NCCL_MIN_CTAS="65"),
        "env.NCCL_MIN_CTAS must be an integer in [1, 64], got '65'",
        id="H-P17",
    ),
    pytest.param(
        env(NCCL_MIN_CTAS="8", NCCL_MAX_CTAS="2"),
        "NCCL_MIN_CTAS must be <= NCCL_MAX_CTAS",
        id="H-P18",
    ),
    pytest.param(
        env(NCCL_SOCKET_NTHREADS="16", NCCL_NSOCKS_PERTHREAD="8"),
        "must be <= 64, got 16 x 8",
        id="H-P19",
    ),
    pytest.param(
        env(OMP_NUM_THREADS="0"),
        "env.OMP_NUM_THREADS must be an integer in [1, 1024], got '0'",
        id="H-P20",
    ),
    pytest.param(
        env(OMP_NUM_THREADS="1; rm -rf ~"),
        "env.OMP_NUM_THREADS must be an integer in [1, 1024]",
        id="H-P21",
    ),
    pytest.param(
        env(OMP_NUM_THREADS="$(touch p)"),
        "env.OMP_NUM_THREADS must be an integer in [1, 1024]",
        id="H-P22",
    ),
    pytest.param(
        env(OMP_NUM_THREADS="-1"), "env.OMP_NUM_THREADS must be an integer in [1, 1024]", id="H-P23"
    ),
    pytest.param(
        env(OMP_NUM_THREADS=" 2"), "env.OMP_NUM_THREADS must be an integer in [1, 1024]", id="H-P24"
    ),
    pytest.param(
        env(OMP_NUM_THREADS="1.5"),
        "env.OMP_NUM_THREADS must be an integer in [1, 1024]",
        id="H-P25",
    ),
    pytest.param(
        env(OMP_NUM_THREADS=2), "to strings (quote numbers), got OMP_NUM_THREADS: 2", id="H-P26"
    ),
    pytest.param(
        lambda d: d.update(env=["OMP_NUM_THREADS=1"]),
        "env must map variable names to strings",
        id="H-P27",
    ),
    pytest.param(
        lambda d: d.update(env=None), "env must map variable names to strings", id="H-P28"
    ),
    # the values autotune computes with
    pytest.param(
        section("workload", world_size=None),
        "workload.world_size must be an integer in [1, 65536]",
        id="H-P29",
    ),
    pytest.param(
        section("workload", world_size="2"),
        "workload.world_size must be an integer in [1, 65536]",
        id="H-P30",
    ),
    pytest.param(
        section("workload", world_size=True),
        "workload.world_size must be an integer in [1, 65536]",
        id="H-P31",
    ),
    pytest.param(
        section("workload", global_batch=0),
        "workload.global_batch must be an integer in [1, 1073741824]",
        id="H-P32",
    ),
    pytest.param(
        section("workload", free_batch="yes"),
        "workload.free_batch must be true or false",
        id="H-P33",
    ),
    pytest.param(
        section("batch", micro_batch=-1),
        "batch.micro_batch must be an integer in [1, 1048576], got -1",
        id="H-P34",
    ),
    pytest.param(
        section("batch", accumulation_steps=0),
        "batch.accumulation_steps must be an integer in [1, 65536]",
        id="H-P35",
    ),
    pytest.param(
        section("batch", global_batch=64.0),
        "batch.global_batch must be an integer in [1, 1073741824]",
        id="H-P36",
    ),
    pytest.param(
        section("ddp", bucket_cap_mb=math.inf),
        "ddp.bucket_cap_mb must be a number above 0 and at most 4096",
        id="H-P37",
    ),
    pytest.param(
        section("ddp", bucket_cap_mb=math.nan),
        "ddp.bucket_cap_mb must be a number above 0 and at most 4096",
        id="H-P38",
    ),
    pytest.param(
        section("ddp", bucket_cap_mb=-1.0),
        "ddp.bucket_cap_mb must be a number above 0 and at most 4096",
        id="H-P39",
    ),
    pytest.param(
        section("ddp", bucket_cap_mb="25"),
        "ddp.bucket_cap_mb must be a number above 0 and at most 4096",
        id="H-P40",
    ),
    pytest.param(
        section("ddp", gradient_as_bucket_view="yes"),
        "ddp.gradient_as_bucket_view must be true",
        id="H-P41",
    ),
    pytest.param(
        section("ddp", static_graph=1), "ddp.static_graph must be true or false, got 1", id="H-P42"
    ),
    pytest.param(
        section("data", num_workers=-1),
        "data.num_workers must be an integer in [0, 256]",
        id="H-P43",
    ),
    pytest.param(
        section("data", num_workers=1.0),
        "data.num_workers must be an integer in [0, 256]",
        id="H-P44",
    ),
    pytest.param(
        section("data", pin_memory="false"), "data.pin_memory must be true or false", id="H-P45"
    ),
    pytest.param(
        section("data", prefetch_factor=0),
        "data.prefetch_factor must be an integer in [1, 64]",
        id="H-P46",
    ),
    pytest.param(
        section("data", persistent_workers=None),
        "data.persistent_workers must be true or false",
        id="H-P47",
    ),
    pytest.param(
        lambda d: d["ddp"].update(comm_hook={"name": "powersgd", "matrix_approximation_rank": 0}),
        "ddp.comm_hook.matrix_approximation_rank must be an integer in [1, 1024]",
        id="H-P48",
    ),
    pytest.param(lambda d: d.update(precision=None), "precision must be one of", id="H-P49"),
    # absolute bounds: no single value exhausts the machine (autotune.core.bounds)
    pytest.param(
        section("data", num_workers=100000),
        "data.num_workers must be an integer in [0, 256]",
        id="H-P50",
    ),
    pytest.param(
        env(OMP_NUM_THREADS="100000"),
        "env.OMP_NUM_THREADS must be an integer in [1, 1024]",
        id="H-P51",
    ),
    pytest.param(
        section("data", prefetch_factor=10**9),
        "data.prefetch_factor must be an integer in [1, 64]",
        id="H-P52",
    ),
    pytest.param(
        section("ddp", bucket_cap_mb=1e300),
        "ddp.bucket_cap_mb must be a number above 0 and at",
        id="H-P53",
    ),
    pytest.param(
        lambda d: d["ddp"].update(
            comm_hook={"name": "powersgd", "matrix_approximation_rank": 10**9}
        ),
        "ddp.comm_hook.matrix_approximation_rank must be an integer in [1, 1024]",
        id="H-P54",
    ),
    pytest.param(
        lambda d: d["ddp"].update(
            comm_hook={
                "name": "powersgd",
                "matrix_approximation_rank": 4,
                "start_powerSGD_iter": 10**12,
            }
        ),
        "ddp.comm_hook.start_powerSGD_iter must be an integer in [0, 1000000]",
        id="H-P55",
    ),
    pytest.param(
        env(NCCL_BUFFSIZE="9" * 18),
        "env.NCCL_BUFFSIZE must be an integer in [1, 1073741824]",
        id="H-P56",
    ),
    pytest.param(
        env(NCCL_NSOCKS_PERTHREAD="100000"),
        "env.NCCL_NSOCKS_PERTHREAD must be an integer in [1, 64]",
        id="H-P57",
    ),
    pytest.param(
        section("batch", micro_batch=2**40, global_batch=2**41),
        "batch.micro_batch must be an integer",
        id="H-P58",
    ),
    pytest.param(
        section("workload", world_size=10**9),
        "workload.world_size must be an integer in [1, 65536]",
        id="H-P59",
    ),
    pytest.param(
        section("ddp", find_unused_parameters=True),
        "ddp: unknown key 'find_unused_parameters'",
        id="H-P60",
    ),
    pytest.param(
        lambda d: d["ddp"].update(comm_hook={"name": "fp16", "process_group": "x"}),
        "ddp.comm_hook: unknown key 'process_group'",
        id="H-P61",
    ),
    pytest.param(
        env(**{"MALLOC_MMAP_THRESHOLD_": "99999999999"}),
        "env.MALLOC_MMAP_THRESHOLD_ must be an",
        id="H-P62",
    ),
    pytest.param(
        env(GLOO_SOCKET_IFNAME="eth0"), "env key 'GLOO_SOCKET_IFNAME' is not allowed", id="H-P63"
    ),
    pytest.param(
        env(NCCL_NET_PLUGIN="/tmp/evil.so"), "env key 'NCCL_NET_PLUGIN' is not allowed", id="H-P64"
    ),
    pytest.param(env(NCCL_BUFFSIZE="09"), "env.NCCL_BUFFSIZE", id="H-P66"),
    pytest.param(lambda d: d.update(version=True), "version True is not supported", id="H-P69"),
    pytest.param(env(NCCL_NTHREADS="0064"), "env.NCCL_NTHREADS", id="H-P67"),
    pytest.param(
        env(**{"MALLOC_TRIM_THRESHOLD_": "4294967296"}),
        "env.MALLOC_TRIM_THRESHOLD_ must be an",
        id="H-P68",
    ),
]


@pytest.mark.parametrize("edit, message", HOSTILE)
def test_a_hostile_profile_is_refused_at_load_naming_file_key_and_rule(tmp_path, edit, message):
    path = write(tmp_path / "hostile.yaml", edit)
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        Profile.load(path)
    text = str(e.value)
    assert text.startswith(f"profile {path}: ")
    assert "\n" not in text
    assert text.endswith("; correct it in the file or export the study again")


def test_the_messages_read_as_one_line_each(tmp_path):
    messages = {}
    for name, edit in [
        ("name", env(LD_PRELOAD="/tmp/evil.so")),
        ("value", env(NCCL_ALGO="foo")),
        ("type", section("workload", world_size=None)),
    ]:
        with pytest.raises(ConfigError) as e:
            Profile.load(write(tmp_path / "p.yaml", edit))
        messages[name] = str(e.value).replace(str(tmp_path), "DIR")
    assert messages == {
        "name": "profile DIR/p.yaml: env key 'LD_PRELOAD' is not allowed: a configuration sets "
        "only "
        "OMP_NUM_THREADS, NCCL_ALGO, NCCL_PROTO, NCCL_BUFFSIZE, NCCL_NTHREADS, NCCL_MIN_CTAS, "
        "NCCL_MAX_CTAS, NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD, MALLOC_MMAP_THRESHOLD_, "
        "MALLOC_TRIM_THRESHOLD_; correct it in the file or "
        "export the study again",
        "value": "profile DIR/p.yaml: env.NCCL_ALGO must be one of Ring, Tree, CollnetDirect, "
        "CollnetChain, NVLS, NVLSTree, PAT, got 'foo'; correct it in the file or export the "
        "study again",
        "type": "profile DIR/p.yaml: workload.world_size must be an integer in [1, 65536], got "
        "None; correct it in the file or export the study again",
    }


def test_the_allowlist_is_the_nccl_knobs_omp_num_threads_and_the_allocator_pin():
    nccl = {name for name, k in KNOBS.items() if k.section == "nccl"}
    assert set(ALLOWED_ENV) == nccl | {"OMP_NUM_THREADS"} | set(allocator.ENV)
    assert all(name.startswith("NCCL_") for name in nccl)


def every_env_value(space: str, target: Target) -> dict[str, list]:
    """Every value a trial of ``space`` on ``target`` can give each environment knob."""
    resolved = SearchSpace.load(space).resolve(target)
    out = {}
    for name, dist in resolved.distributions.items():
        if KNOBS[name].section not in ("nccl", "cpu"):
            continue
        if isinstance(dist, CategoricalDistribution):
            out[name] = list(dist.choices)
        else:
            out[name] = list(range(dist.low, dist.high + 1, dist.step or 1))
    return out


@pytest.mark.parametrize("space", available_spaces())
@pytest.mark.parametrize("target", [CPU, GPU], ids=["gloo", "nccl"])
def test_every_env_value_a_real_trial_can_produce_passes(space, target):
    try:
        choices = every_env_value(space, target)
    except ConfigError:
        pytest.skip(f"{space} has nothing to tune on {target.backend}")
    if space == "default" and target is GPU:  # not a vacuous test
        assert {"threads", "NCCL_ALGO", "NCCL_BUFFSIZE", "NCCL_NTHREADS"} <= set(choices)
    defaults = SearchSpace.load(space).resolve(target).defaults()
    for name, values in choices.items():
        for value in values:
            check_env(TrialConfig.from_values({**defaults, name: value}, target).env)


CANDIDATES = [
    0,
    1,
    2,
    16,
    17,
    64,
    65,
    100,
    512,
    4194304,
    -1,
    *NCCL_ALGOS,
    *NCCL_PROTOS,
    *NCCL_NTHREADS,
    "ring",
    "Ring,Tree",
    "default",
    2**25,
    2**25 + 1,
    2**30,
    2**51,
    "32M",
    "0x100",
]


@pytest.mark.parametrize("name", list(ALLOWED_ENV))
def test_an_env_value_passes_exactly_when_its_knob_allows_it(name):
    """The registry's rule decides: what a space may hold, written as a trial writes it."""
    knob = ALLOWED_ENV[name]
    for value in CANDIDATES:
        allowed = knob.legal(value) is None and value != "default"
        if allowed:
            check_env({name: str(value)})
        else:
            with pytest.raises(ConfigError, match=f"env.{name} must"):
                check_env({name: str(value)})


def test_a_profile_of_every_nccl_choice_round_trips(tmp_path):
    cfg = TrialConfig.from_values(
        {
            **SearchSpace.load("default").resolve(GPU).defaults(),
            "NCCL_ALGO": "Tree",
            "NCCL_PROTO": "LL128",
            "NCCL_BUFFSIZE": 8388608,
            "NCCL_NTHREADS": 512,
            "NCCL_MIN_CTAS": 2,
            "NCCL_MAX_CTAS": 32,
            "NCCL_SOCKET_NTHREADS": 4,
            "NCCL_NSOCKS_PERTHREAD": 16,
            "threads": 8,
        },
        GPU,
    )
    p = profile(cfg, GPU)
    assert Profile.load(p.save(tmp_path / "p.yaml")).env == cfg.env
    assert len(cfg.env) == len(ALLOWED_ENV)


def test_a_hostile_study_config_is_refused_naming_study_and_trial():
    bad = TrialConfig(**{**config().to_dict(), "env": {"LD_PRELOAD": "/tmp/evil.so"}})
    with pytest.raises(
        ConfigError,
        match=r"^study 's' trial 3: env key 'LD_PRELOAD' is not "
        r"allowed: .*export another trial \(--trial N\)$",
    ):
        profile(bad)
    bad = TrialConfig(**{**config().to_dict(), "micro_batch": None})
    with pytest.raises(ConfigError, match=r"^study 's' trial 3: batch.micro_batch must be"):
        profile(bad)
    bad = TrialConfig(**{**config().to_dict(), "env": "OMP_NUM_THREADS=1"})
    with pytest.raises(ConfigError, match=r"^study 's' trial 3: config.env must be a mapping"):
        profile(bad)


def hostile_study(url: str, env: dict[str, str]) -> None:
    study = optuna.create_study(study_name="shared", storage=url, direction="maximize")
    study.set_user_attr("autotune", {"workload": WORKLOAD, "hardware": HARDWARE})
    cfg = {**config().to_dict(), "env": env}
    for value, attrs in ((1.0, {"baseline": True}), (2.0, {})):
        study.add_trial(
            create_trial(
                params={}, distributions={}, value=value, user_attrs={"config": cfg, **attrs}
            )
        )


@pytest.mark.parametrize("env_", [{"X;touch pwned": "1"}, {"OMP_NUM_THREADS": "$(touch pwned)"}])
def test_autotune_export_of_a_hostile_study_is_a_one_line_error(tmp_path, env_):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    hostile_study(url, env_)
    for output in ([], ["-o", str(tmp_path / "best.yaml")]):
        p = run("export", "--storage", url, "--study-name", "shared", *output, cwd=tmp_path)
        assert p.returncode == 2, p.stderr
        assert p.stdout == ""
        assert p.stderr.count("\n") == 1, p.stderr
        assert p.stderr.startswith("autotune: error: study 'shared' trial 1: env")
        assert "export another trial (--trial N)" in p.stderr
    assert sorted(f.name for f in tmp_path.iterdir()) == ["shared.db"]


def test_autotune_env_output_evals_to_exactly_the_profiles_values(tmp_path):
    cfg = TrialConfig.from_values(
        {
            **SearchSpace.load("default").resolve(GPU).defaults(),
            "NCCL_ALGO": "Ring",
            "NCCL_BUFFSIZE": 8388608,
            "threads": 4,
        },
        GPU,
    )
    path = profile(cfg, GPU).save(tmp_path / "best.yaml")
    p = run("env", str(path))
    assert p.returncode == 0, p.stderr
    assert p.stdout == (
        "export NCCL_ALGO=Ring\nexport NCCL_BUFFSIZE=8388608\nexport OMP_NUM_THREADS=4\n"
        "export MALLOC_MMAP_THRESHOLD_=33554432\nexport MALLOC_TRIM_THRESHOLD_=1073741824\n"
    )
    shown = bash(p.stdout + "env | grep -E '^(NCCL_|OMP_|MALLOC_)' | sort", tmp_path).stdout
    assert shown.splitlines() == sorted(f"{k}={v}" for k, v in cfg.env.items())


@pytest.mark.parametrize(
    "edit",
    [
        env(**{"X;touch pwned": "1"}),
        env(**{"$(touch pwned)": "1"}),
        env(**{"`touch pwned`": "1"}),
        env(NCCL_ALGO="Ring;touch pwned"),
        env(NCCL_ALGO="$(touch pwned)"),
        env(NCCL_PROTO="`touch pwned`"),
        env(OMP_NUM_THREADS="1; touch pwned"),
        env(OMP_NUM_THREADS="1$(touch pwned)"),
    ],
)
def test_autotune_env_refuses_a_hostile_profile_and_prints_nothing(tmp_path, edit):
    path = write(tmp_path / "hostile.yaml", edit)
    p = run("env", str(path))
    assert p.returncode == 2
    assert p.stdout == ""
    assert p.stderr.startswith(f"autotune: error: profile {path}: env")
    assert p.stderr.count("\n") == 1, p.stderr
    bash(f"eval {shlex.quote(p.stdout)}", tmp_path)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize(
    "value",
    ["Ring;touch pwned", "$(touch pwned)", "`touch pwned`", "a'b\"c", "x\ny", "$HOME", " ", ""],
)
def test_shell_exports_quote_values_so_eval_sets_exactly_that_string(tmp_path, value):
    """Behind the load check: even an unchecked value reaches the shell as one string."""
    out = shell_exports({"NCCL_ALGO": value})
    shown = bash(f'eval {shlex.quote(out)}; printf %s "$NCCL_ALGO"', tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == value
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("name", ["X;touch pwned", "$(touch pwned)", "`touch pwned`", "A B"])
def test_shell_exports_quote_names_so_eval_runs_nothing(tmp_path, name):
    out = shell_exports({name: "1"})
    bash(f"eval {shlex.quote(out)}", tmp_path)
    assert not (tmp_path / "pwned").exists()


def test_launch_refuses_a_hostile_profile_and_runs_nothing(tmp_path):
    path = write(tmp_path / "hostile.yaml", env(LD_PRELOAD="/tmp/evil.so"))
    p = run("launch", str(path), "--", "touch", str(tmp_path / "ran"))
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "env key 'LD_PRELOAD' is not allowed" in p.stderr
    assert not (tmp_path / "ran").exists()


def test_launch_of_a_missing_command_is_a_one_line_error(tmp_path):
    path = write(tmp_path / "best.yaml")
    p = run("launch", str(path), "--", "no-such-command-anywhere", "x")
    assert p.returncode == 2
    assert p.stdout == ""
    assert (
        p.stderr == "autotune: error: autotune launch: no such command "
        "'no-such-command-anywhere' (not an executable file, nor on PATH)\n"
    )


def test_launch_becomes_the_command_with_the_profiles_env(tmp_path):
    """exec, not a child: the command runs as the very process ``autotune launch`` was."""
    path = write(tmp_path / "best.yaml")
    p = subprocess.Popen(
        [AUTOTUNE, "launch", str(path), "--", "bash", "-c", 'echo "$$ $OMP_NUM_THREADS"; exit 3'],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3, err
    assert out.split() == [str(p.pid), "1"]
    assert "measured on other hardware" in err  # printed before the exec


def test_apply_env_refuses_an_env_changed_after_load():
    p = profile()
    p.env["LD_PRELOAD"] = "/tmp/evil.so"
    environ: dict[str, str] = {}
    with pytest.raises(ConfigError, match="env key 'LD_PRELOAD' is not allowed"):
        p.apply_env(environ)
    assert environ == {}
