#!/usr/bin/env bash
# The lab's first-contact check on a GPU machine, in one command: versions, the memory trace against the card
# (bench/gpu_memory.py), the tiny model's SFT and GRPO stages on CUDA (scripts/train_*.py), the fast test lane with
# CUDA visible, and the five notebooks through papermill as `make demo` runs them. Each part has its own time limit
# and log; a part that fails does not stop the next.
#
#   scripts/gpu_smoke.sh --fetch     # here, with the package index: the wheels the GPU machine lacks, into .whl/
#   scripts/gpu_smoke.sh             # there (no network): install .whl/ into /tmp/site, run every part
#
# Environment: OUT (default outputs/gpu_smoke: results.tgz, every log), LOGS (where the parts write; default $OUT),
# PY (default python3, the machine's torch), PARTS (default "env memory sft tests grpo demo"), SFT_OVERRIDES (Hydra
# overrides for the SFT and GRPO parts; default: the tiny demo's), and each part's limit in seconds: MEMORY_S, SFT_S,
# TESTS_S, GRPO_S, DEMO_S; MEMORY_ARGS (bench/gpu_memory.py options, e.g. "--tokens 8192 --cases kernel real").
#
# Why these wheels: the GPU image has torch, transformers, accelerate, pandas and the rest of the numeric stack,
# but not TRL, PEFT 0.21, datasets, Hydra/OmegaConf, the Jupyter stack or mamba_ssm. mamba_ssm is built without its
# CUDA extensions (MAMBA_SKIP_CUDA_BUILD): its Triton chunk scan is what Nemotron-H's Mamba-2 path runs, and
# bench/gpu_memory.py loads it without the package __init__ that wants the compiled Mamba-1 scan. The wheels come to
# about 22 MB, under the 64 MiB a device call carries.
set -uo pipefail
cd "$(dirname "$0")/.."
WHL=${WHL:-.whl}

if [[ "${1:-}" == "--fetch" ]]; then
  set -e
  VPY=${VPY:-.venv/bin/python}  # the lab's venv: its torch builds the mamba_ssm wheel's metadata
  mkdir -p "$WHL"
  grep -qx "/$WHL/" .git/info/exclude 2>/dev/null || echo "/$WHL/" >> .git/info/exclude
  plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
  "$VPY" -m pip download -q --no-deps "${plat[@]}" -d "$WHL" \
    trl==1.15.0 peft==0.21.2 datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19 hydra-core==1.3.8 omegaconf==2.3.1 \
    filelock==4.3.1 hydra-joblib-launcher==1.2.0 hydra-submitit-launcher==1.2.0 submitit==1.5.4 einops==0.8.2 \
    import-linter==2.17 grimp==3.14
  # the Jupyter stack papermill runs the notebooks with (the `demo` part), less what the image has
  "$VPY" -m pip download -q --no-deps "${plat[@]}" -d "$WHL" \
    papermill==2.7.0 nbclient==0.11.0 nbformat==5.11.1 jupyter-client==8.10.0 jupyter-core==5.9.1 ipykernel==7.4.0 \
    ipython==9.18.1 ipython-pygments-lexers==1.1.1 traitlets==5.16.1 pyzmq==27.3.0 tornado==6.6.1 comm==0.2.3 \
    debugpy==1.8.22 matplotlib-inline==0.2.2 nest-asyncio2==1.7.4 jedi==0.20.1 parso==0.8.7 prompt-toolkit==3.0.53 \
    wcwidth==0.9.4 stack-data==0.6.3 asttokens==3.0.2 executing==2.3.0 pure-eval==0.2.4 fastjsonschema==2.22.3 \
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 \
    platformdirs==4.14.8 entrypoints==0.4.2 tenacity==9.2.1 tzdata==2026.6 cffi==2.1.1 pycparser==3.12
  # sources only on the index: antlr4 (Hydra's parser, pure Python) and mamba_ssm (no CUDA build: module docstring)
  "$VPY" -m pip wheel -q --no-deps -w "$WHL" antlr4-python3-runtime==4.9.3
  MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE "$VPY" -m pip wheel -q --no-deps --no-build-isolation \
    -w "$WHL" mamba-ssm==2.3.2.post1
  du -sh "$WHL"; ls "$WHL"
  exit 0
fi

OUT=${OUT:-outputs/gpu_smoke}
LOGS=${LOGS:-$OUT}  # where each part writes; $OUT/results.tgz holds them all, renewed after every part
PY=${PY:-python3}
PARTS=${PARTS:-"env memory sft tests grpo demo"}
mkdir -p "$OUT" "$LOGS"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
export PYTHONUNBUFFERED=1
if compgen -G "$WHL/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHL"/*.whl \
    || { echo "wheel install failed" >&2; exit 2; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

part() {  # part NAME LIMIT_S COMMAND...: run it with a limit, log to $OUT/NAME.log, print its time and status
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s): $*"
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc in $((SECONDS - t0)) s" | tee -a "$LOGS/parts.txt"
  tail -n 25 "$LOGS/$name.log"
}

pack() {  # every log and result in one file (the device tool brings back a few files only)
  tar czf /tmp/gpu_smoke_results.tgz -C "$LOGS" --exclude results.tgz . \
    && mv /tmp/gpu_smoke_results.tgz "$OUT/results.tgz"
}

for p in $PARTS; do
  case $p in
    env)
      part env 60 bash -c "nvidia-smi; $PY - <<'EOF'
import importlib, torch
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())
for m in ('transformers', 'trl', 'peft', 'accelerate', 'datasets', 'hydra', 'triton', 'mamba_ssm', 'causal_conv1d'):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, '__version__', '?'), mod.__file__)
    except Exception as e:
        print(m, 'does not import:', type(e).__name__, str(e)[:200])
EOF" ;;
    memory) part memory "${MEMORY_S:-220}" "$PY" bench/gpu_memory.py --out "$LOGS" ${MEMORY_ARGS:-} ;;
    sft) rm -rf outputs/gpu_smoke_run
         part sft "${SFT_S:-130}" "$PY" scripts/train_sft.py run_name=gpu_smoke_run ${SFT_OVERRIDES:-}
         cp outputs/gpu_smoke_run/02_sft/metrics.json "$LOGS/sft_metrics.json" 2>/dev/null ;;
    grpo) part grpo "${GRPO_S:-100}" "$PY" scripts/train_grpo.py run_name=gpu_smoke_run ${SFT_OVERRIDES:-}
          cp outputs/gpu_smoke_run/03_grpo/metrics.json "$LOGS/grpo_metrics.json" 2>/dev/null ;;
    demo) rm -rf outputs/gpu_smoke_demo  # the five notebooks through papermill, as `make demo` runs them
          part demo "${DEMO_S:-300}" "$PY" -m lab demo run_name=gpu_smoke_demo ${SFT_OVERRIDES:-}
          cp outputs/gpu_smoke_demo/summary.md "$LOGS/demo_summary.md" 2>/dev/null ;;
    tests) part tests "${TESTS_S:-140}" "$PY" -m pytest -m "not slow" -n 8 -p no:cacheprovider -q -rfE \
             --junitxml="$LOGS/tests.xml" ;;
    *) echo "unknown part $p" >&2 ;;
  esac
  pack
done
