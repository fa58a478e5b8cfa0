#!/usr/bin/env bash
# The lab's own GPU check, sized for a short run on a borrowed machine with no network and under 64 MiB of files
# copied onto it: one command, at most 10 minutes (TOTAL_S), one report ($OUT/report.md: the text of RESULTS.md's
# "GPU check" section). Its parts, each with its own limit and log, each cut to the time left:
#   env        nvidia-smi, versions
#   kernels    causal_conv1d and mamba_ssm: their wheels installed when they came, else built here from the patched
#              sources when nvcc is here (scripts/build_mamba_wheels.sh with VPY/SDIST: minutes on 16 cores, one arch)
#   calibrate  `python -m lab calibrate $CAL_OVERRIDES`: each fast path's exactness and the training step's speed on
#              this card (lab/train/calibrate.py; <= 8 minutes on an H100 by design)
#   tests      the fast test lane with CUDA visible
#
#   scripts/gpu_smoke.sh --fetch     # here, with the package index: the wheels the GPU machine lacks, into .whl/
#   scripts/gpu_smoke.sh             # there (no network): install .whl/ into /tmp/site, run the parts, write the report
#
# --fetch: the lab's dependencies the GPU image lacks (TRL, PEFT 0.21, datasets, Hydra/OmegaConf, einops, ninja, the
# Jupyter stack) and the kernels: by default their two sdists, for the GPU machine to build for its own card (the
# `kernels` part); KERNELS=build compiles their wheels here for ARCH (default 90: H100/H200) and strips them
# (scripts/build_mamba_wheels.sh, STRIP=1: needs nvcc of CUDA 13 and downloads torch 2.14). It refuses a .whl/ over
# 64 MiB.
#
# Environment: OUT (default outputs/gpu_smoke: report.md, results.tgz, every log), PY (default python3, the
# machine's torch), PARTS (default "env kernels calibrate tests"), CAL_OVERRIDES (default "experiment=competition
# gpu=<the card nvidia-smi names>": the recipe at the real model's shapes, random weights), TOTAL_S (600), and each
# part's own limit:
# BUILD_S (300), CAL_S (480), TESTS_S (120).
set -uo pipefail
cd "$(dirname "$0")/.."
WHL=${WHL:-.whl}
ARCH=${ARCH:-90}

if [[ "${1:-}" == "--fetch" ]]; then
  set -e
  VPY=${VPY:-.venv/bin/python}  # the lab's venv: its torch prepares the kernels' metadata
  mkdir -p "$WHL/src"  # .whl/ is in .gitignore
  plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
  "$VPY" -m pip download -q --no-deps "${plat[@]}" -d "$WHL" \
    trl==1.15.0 peft==0.21.2 datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19 hydra-core==1.3.8 omegaconf==2.3.1 \
    filelock==4.3.1 einops==0.8.2 ninja==1.13.0 import-linter==2.17 grimp==3.14
  # the Jupyter stack the lab imports (papermill: lab.runs) and the test lane's notebook tests need, less the image's
  "$VPY" -m pip download -q --no-deps "${plat[@]}" -d "$WHL" \
    papermill==2.7.0 nbclient==0.11.0 nbformat==5.11.1 jupyter-client==8.10.0 jupyter-core==5.9.1 ipykernel==7.4.0 \
    ipython==9.18.1 ipython-pygments-lexers==1.1.1 traitlets==5.16.1 pyzmq==27.3.0 tornado==6.6.1 comm==0.2.3 \
    debugpy==1.8.22 matplotlib-inline==0.2.2 nest-asyncio2==1.7.4 jedi==0.20.1 parso==0.8.7 prompt-toolkit==3.0.53 \
    wcwidth==0.9.4 stack-data==0.6.3 asttokens==3.0.2 executing==2.3.0 pure-eval==0.2.4 fastjsonschema==2.22.3 \
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 \
    platformdirs==4.14.8 entrypoints==0.4.2 tenacity==9.2.1 tzdata==2026.6 cffi==2.1.1 pycparser==3.12
  "$VPY" -m pip wheel -q --no-deps -w "$WHL" antlr4-python3-runtime==4.9.3  # Hydra's parser: a source on the index
  if [[ "${KERNELS:-sources}" == build ]]; then  # its own venv with torch 2.14 (CUDA), nvcc here: compiled here
    env -u VPY OUT="$WHL" ARCHS="$ARCH" STRIP=1 PYTHON_VERSION=3.12 WORK=/tmp/lab_smoke_build \
      scripts/build_mamba_wheels.sh
  else  # the GPU machine builds them (the `kernels` part)
    CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE "$VPY" -m pip download -q --no-deps \
      --no-binary :all: --no-build-isolation -d "$WHL/src" causal-conv1d==1.7.0 mamba-ssm==2.3.2.post1
  fi
  du -sh "$WHL"; ls "$WHL" "$WHL/src"
  (( $(du -sm "$WHL" | cut -f1) < 64 )) || { echo "$WHL is over 64 MiB: a device call carries less" >&2; exit 2; }
  exit 0
fi

OUT=${OUT:-outputs/gpu_smoke}
PY=${PY:-python3}
PARTS=${PARTS:-"env kernels calibrate tests"}
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$CARD" in *H200*) GPU=h200 ;; *"RTX PRO 6000"*) GPU=rtx_pro_6000 ;; *) GPU=h100_80gb ;; esac
CAL_OVERRIDES=${CAL_OVERRIDES:-"experiment=competition gpu=$GPU"}
TOTAL_S=${TOTAL_S:-600}
mkdir -p "$OUT"
: >"$OUT/parts.txt"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
export PYTHONUNBUFFERED=1
START=$SECONDS
if compgen -G "$WHL/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl \
    || { echo "wheel install failed" >&2; exit 2; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

part() {  # part NAME LIMIT_S COMMAND...: run it within its limit and the time left, log to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  local left=$((TOTAL_S - (SECONDS - START)))
  (( limit > left )) && limit=$left
  if (( limit < 10 )); then
    echo "== $name: not run, ${left} s left of TOTAL_S=$TOTAL_S" | tee -a "$OUT/parts.txt"; return
  fi
  local t0=$SECONDS
  echo "== $name (limit ${limit}s): $*"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc in $((SECONDS - t0)) s (limit $limit s)" | tee -a "$OUT/parts.txt"
  tail -n 15 "$OUT/$name.log"
}

kernels() {  # installed when their wheels came; else built from the sources that came, then installed
  if "$PY" -c "import causal_conv1d, mamba_ssm" 2>/dev/null; then echo "both kernels import"; return 0; fi
  compgen -G "$WHL/src/*.tar.gz" >/dev/null || { echo "no kernel wheels and no sources in $WHL/src"; return 1; }
  local arch; arch=$("$PY" -c "import torch; a, b = torch.cuda.get_device_capability(); print(f'{a}{b}')")
  VPY="$PY" SDIST="$WHL/src" ARCHS="$arch" OUT=/tmp/lab_kernels WORK=/tmp/lab_mamba_build \
    PYTHON_VERSION=$("$PY" -c "import sys; print('%d.%d' % sys.version_info[:2])") scripts/build_mamba_wheels.sh \
    && "$PY" -m pip install -q --no-index --no-deps --target /tmp/site /tmp/lab_kernels/*.whl \
    && "$PY" -c "import causal_conv1d, mamba_ssm; print('both kernels import')"
}

for p in $PARTS; do
  case $p in
    env) part env 60 bash -c "nvidia-smi; $PY -m pip list 2>/dev/null \
           | grep -iE '^(torch|transformers|peft|trl|triton|mamba|causal)'" ;;
    kernels) part kernels "${BUILD_S:-300}" bash -c "$(declare -f kernels); PY=$PY WHL=$WHL kernels" ;;
    calibrate) rm -f "$OUT/calibration.json"
               part calibrate "${CAL_S:-480}" "$PY" -m lab calibrate $CAL_OVERRIDES --json "$OUT/calibration.json" ;;
    tests) part tests "${TESTS_S:-120}" "$PY" -m pytest -m "not slow" -n 8 -p no:cacheprovider -q -rfE \
             --junitxml="$OUT/tests.xml" ;;
    *) echo "unknown part $p" >&2 ;;
  esac
done
"$PY" -m lab calibrate --report "$OUT" >"$OUT/report.md" 2>"$OUT/report.log"
cat "$OUT/report.md"
tar czf /tmp/gpu_smoke_results.tgz -C "$OUT" --exclude results.tgz . && mv /tmp/gpu_smoke_results.tgz "$OUT/results.tgz"
echo "== total $((SECONDS - START)) s of TOTAL_S=$TOTAL_S; report: $OUT/report.md"
