#!/usr/bin/env bash
# The pinned GPU-only packages' own Python sources, for tests/test_gpu_signatures.py (every call the lab makes into
# them is bound to their real signatures on the CPU). `make gpu-sources` runs this once per pin; tests never fetch.
#
#   scripts/gpu_sources.sh PYTHON OUT
#
# Pins, each read from its one home: vllm from pyproject.toml's gpu extra; causal-conv1d and mamba-ssm from
# scripts/build_mamba_wheels.sh. `pip download --no-deps` fetches vLLM's wheel (336 MB for 0.33.0, under a minute
# here) and the two kernels' sdists (PyPI has them only as source; their metadata step imports torch, hence
# --no-build-isolation with the venv's torch, and the *_SKIP_CUDA_BUILD switches so it needs no nvcc). Only the .py
# files listed below are kept (about 1 MB); the downloads are deleted. OUT/VERSIONS records what was fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:?python}
OUT=${2:?output folder}

VLLM=$(grep -o '"vllm==[^"]*"' pyproject.toml | head -1 | tr -d '"')
CONV=$(grep -o '"causal-conv1d==[^"]*"' scripts/build_mamba_wheels.sh | head -1 | tr -d '"')
MAMBA=$(grep -o '"mamba-ssm==[^"]*"' scripts/build_mamba_wheels.sh | head -1 | tr -d '"')
[[ -n "$VLLM" && -n "$CONV" && -n "$MAMBA" ]] || { echo "gpu_sources.sh: a pin was not found" >&2; exit 2; }

KEEP_VLLM=(vllm/entrypoints/llm.py vllm/engine/arg_utils.py vllm/sampling_params.py vllm/lora/request.py
           vllm/v1/engine/llm_engine.py vllm/v1/worker/gpu_worker.py vllm/v1/worker/gpu_model_runner.py)
KEEP_CONV=(causal_conv1d/causal_conv1d_interface.py)
KEEP_MAMBA=(mamba_ssm/ops/triton/ssd_combined.py)

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE
timeout 900 "$PY" -m pip download --quiet --no-deps --only-binary :all: "$VLLM" -d "$TMP/vllm"
timeout 600 "$PY" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation "$CONV" "$MAMBA" \
  -d "$TMP/sdist"

rm -rf "$OUT.partial"
mkdir -p "$OUT.partial"
"$PY" -m zipfile -e "$TMP"/vllm/vllm-*.whl "$TMP/vllm/x" >/dev/null
for f in "${KEEP_VLLM[@]}"; do install -D -m 644 "$TMP/vllm/x/$f" "$OUT.partial/vllm/$f"; done
for spec in "$CONV" "$MAMBA"; do
  name=${spec%%==*}
  tar -xzf "$TMP"/sdist/"${name//-/_}"-*.tar.gz -C "$TMP/sdist"
done
for f in "${KEEP_CONV[@]}"; do install -D -m 644 "$TMP"/sdist/causal_conv1d-*/"$f" "$OUT.partial/causal-conv1d/$f"; done
for f in "${KEEP_MAMBA[@]}"; do install -D -m 644 "$TMP"/sdist/mamba_ssm-*/"$f" "$OUT.partial/mamba-ssm/$f"; done
printf '%s\n' "$VLLM" "$CONV" "$MAMBA" > "$OUT.partial/VERSIONS"
rm -rf "$OUT"
mv "$OUT.partial" "$OUT"
echo "gpu sources: $(tr '\n' ' ' < "$OUT/VERSIONS")-> $OUT ($(du -sh "$OUT" | cut -f1))"
