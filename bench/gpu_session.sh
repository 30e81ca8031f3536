#!/usr/bin/env bash
# The GPU checks, as run on a lent GPU machine with no package index (docs/gpu.md).
#
#   bench/gpu_session.sh setup check tests          # the install, the device, tests/.../test_gpu.py
#   bench/gpu_session.sh setup tune:transformer     # a tuning run, then its profile applied
#   bench/gpu_session.sh setup script               # docs/script-mode.md's example, script mode
#
# `setup` installs autotune and what the machine lacks from .whl/ (wheels, and Ray repacked as
# .tar.xz: its wheel is over one transfer's limit). Every step logs to
# $OUT/<step>.log (OUT defaults to ./gpu-logs) and a failing step does not stop the next.
set -u
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export AUTOTUNE_HOME=${AUTOTUNE_HOME:-/tmp/autotune-home}
BUDGET=${BUDGET:-5m}

setup() {
    # Into the machine's own Python (it is given back bare): the wheels, Ray unpacked into its
    # site-packages, and autotune editable, so that tests run from the checkout import it.
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl \
        || return
    tar xJf .whl/ray-*.tar.xz -C "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
        || return
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile -e . \
        || return
    python3 -c "import ray, optuna, autotune, torch; print('ray', ray.__version__, 'optuna', \
optuna.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda)"
    command -v autotune
}

check() {
    nvidia-smi
    nvidia-smi nvlink --status
    nvidia-smi topo -m
    nproc
    python3 -c "import json; from autotune.launch.hardware import describe; \
print(json.dumps(describe('nccl'), indent=1))"
}

tests() {
    python3 -m pytest -v -s -p no:cacheprovider -o addopts= tests/integration/test_gpu.py \
        tests/integration/test_gpu_run.py tests/integration/test_gpu_script.py ${TESTS_K:+-k "$TESTS_K"}
}

unit() {
    python3 -m pytest -q -p no:cacheprovider -o addopts= -n 8 tests/unit
}

# A tuning run of a built-in study on the GPU, then its profile applied by a torchrun script,
# alternately with PyTorch's defaults (bench/apply_profile.py). Extra options per study:
# the transformer at a size that gives an H100 work (the study's own size is a CPU's).
tune() {
    local study=$1 opts=()
    if [ "$study" = transformer ]; then
        for o in vocab=8192 seq_len=256 dim=512 heads=8 layers=6 global_batch=64; do
            opts+=(--trainer-option "$o")
        done
    fi
    local started=$SECONDS
    autotune run --study "$study" "${opts[@]}" --budget "$BUDGET" --seed 0
    echo "autotune run: $((SECONDS - started)) s in all"
    local prof
    prof=$(ls "$AUTOTUNE_HOME"/profiles/*.yaml | head -1)
    cp "$prof" "$OUT/$study-profile.yaml"
    cp "$AUTOTUNE_HOME/autotune.db" "$OUT/$study.db"
    for round in 1 2; do
        torchrun --nproc-per-node 1 bench/apply_profile.py "$prof" --defaults --seconds 12
        autotune launch "$prof" -- torchrun --nproc-per-node 1 bench/apply_profile.py "$prof" \
            --seconds 12
    done
}

# docs/script-mode.md's example as written (nccl and one rank per GPU where there is one), tuned
# in script mode from a fresh directory, then its profile against the script as it is, in
# interleaved rounds (autotune compare). The run's directory (logs, study) lands in $OUT/script-home.tgz.
script() {
    local dir started=$SECONDS prof gpus
    dir=$(mktemp -d)
    python3 - "$dir/train.py" <<'PY'
import re, sys
from pathlib import Path
page = Path("docs/script-mode.md").read_text().split("## A complete example", 1)[1]
Path(sys.argv[1]).write_text(re.search(r"```python\n(.*?)```", page, re.S).group(1))
PY
    gpus=$(python3 -c "import torch; print(max(1, torch.cuda.device_count()))")
    (cd "$dir" && autotune run --budget "$BUDGET" --global-batch 128 --seed 0 \
        -- torchrun --nproc-per-node "$gpus" train.py --lr 3e-4)
    echo "autotune run: $((SECONDS - started)) s in all"
    prof=$(ls -t "$AUTOTUNE_HOME"/profiles/*script*.yaml | head -1)
    cp "$prof" "$OUT/script-profile.yaml"
    (cd "$dir" && autotune compare asis "$prof" --rounds "${ROUNDS:-3}" \
        -- torchrun --nproc-per-node "$gpus" train.py --lr 3e-4)
    tar czf "$OUT/script-home.tgz" -C "$AUTOTUNE_HOME" .
}

for step in "$@"; do
    echo "=== $step $(date -u +%T)"
    case $step in
        tune:*) tune "${step#tune:}" >"$OUT/${step#tune:}.log" 2>&1 ;;
        *) "$step" >"$OUT/$step.log" 2>&1 ;;
    esac
    echo "=== $step: exit $? $(date -u +%T)"
    tail -n 25 "$OUT/${step#tune:}.log"
done
