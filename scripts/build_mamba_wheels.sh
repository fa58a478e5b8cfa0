#!/usr/bin/env bash
# Build the fused Mamba-2 kernels' wheels once: causal-conv1d 1.7.0 and mamba-ssm 2.3.2.post1 (PyPI has them only as
# source), against the GPU stack's torch 2.14 CUDA build, for the GPUs users have (sm_90: H100/H200; sm_120: RTX PRO
# 6000, Kaggle's). lab.model.models.check_mamba_kernels refuses real-model training without them; the Kaggle kernel's
# install cell installs them from the wheel dataset (lab.kaggle.kernel).
#
#   scripts/build_mamba_wheels.sh                  # wheels into kaggle_kernel/build/dataset/
#   scripts/build_mamba_wheels.sh --prepare-only   # venv, torch, sdists, patched sources, nvcc check: no compiling
#
# Environment (defaults in brackets):
#   PYTHON_VERSION  the wheels' Python, must be the Kaggle image's [kaggle.python_version in conf/kaggle/default.yaml]
#   PYTHON          the interpreter of that version [pythonX.Y on PATH, else pyenv's]
#   OUT             where the wheels go [kaggle_kernel/build/dataset]
#   ARCHS           compute capabilities [90 120]
#   TORCH_SPEC      the torch to build against ["torch==2.14.0", the GPU extra's pin]
#   CUDA_HOME       a CUDA toolkit whose nvcc has torch's CUDA major version [/usr/local/cuda]
#   WORK            scratch folder (venv, sources) [/tmp/lab_mamba_build]
#   MAX_JOBS        parallel compile jobs (torch.utils.cpp_extension / ninja) [nproc]
#   REBUILD         1 builds a wheel again that OUT already holds [0: a rerun resumes after the last wheel built]
#   VPY             build with this interpreter and its torch as they are, no venv, no pip install [unset: a venv]
#   SDIST           a folder holding the two sdists: no download (offline, scripts/gpu_smoke.sh) [unset: downloaded]
#   STRIP           1 strips the wheels' shared libraries of their symbols (smaller; scripts/gpu_smoke.sh) [0]
#
# Why the setup.py files are patched: both pin -std=c++17, which torch 2.14's headers refuse (C++20 or later), and
# both hard-code their -gencode list (sm_75 ... sm_121 for CUDA 13) and ignore
# TORCH_CUDA_ARCH_LIST, so the script keeps only ARCHS there; TORCH_CUDA_ARCH_LIST sets the flags torch's
# cpp_extension adds itself. *_FORCE_BUILD=TRUE stops setup.py from looking for a prebuilt wheel on GitHub.
set -euo pipefail
cd "$(dirname "$0")/.."

PREPARE_ONLY=0
[[ "${1:-}" == "--prepare-only" ]] && PREPARE_ONLY=1

PYTHON_VERSION=${PYTHON_VERSION:-$(sed -n 's/^python_version: *"\{0,1\}\([0-9.]*\)"\{0,1\}.*/\1/p' conf/kaggle/default.yaml)}
[[ -n "$PYTHON_VERSION" ]] || { echo "no PYTHON_VERSION and no python_version in conf/kaggle/default.yaml" >&2; exit 2; }
is_version() { "$1" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$PYTHON_VERSION'.split('.'))))" 2>/dev/null; }
if [[ -z "${PYTHON:-}" ]]; then
  for c in "python$PYTHON_VERSION" "$HOME"/.pyenv/versions/"$PYTHON_VERSION".*/bin/python3; do
    if is_version "$c"; then PYTHON=$c; break; fi
  done
fi
[[ -n "${VPY:-}" ]] && PYTHON=${PYTHON:-$VPY}
[[ -n "${PYTHON:-}" ]] && is_version "$PYTHON" \
  || { echo "need a Python $PYTHON_VERSION interpreter (set PYTHON=...): the wheels are CPython-version specific" >&2; exit 2; }
OUT=${OUT:-kaggle_kernel/build/dataset}
ARCHS=${ARCHS:-"90 120"}
TORCH_SPEC=${TORCH_SPEC:-"torch==2.14.0"}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
WORK=${WORK:-/tmp/lab_mamba_build}
MAX_JOBS=${MAX_JOBS:-$(nproc)}
PKGS=("causal-conv1d==1.7.0" "mamba-ssm==2.3.2.post1")
export CUDA_HOME MAX_JOBS

echo "== Python $PYTHON_VERSION ($PYTHON), $TORCH_SPEC, archs $ARCHS, CUDA_HOME=$CUDA_HOME, out $OUT"
NVCC_RELEASE=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
[[ -n "$NVCC_RELEASE" ]] || { echo "$CUDA_HOME/bin/nvcc: not found or unreadable" >&2; exit 2; }
echo "== nvcc $NVCC_RELEASE"

mkdir -p "$WORK" "$OUT"
if [[ -z "${VPY:-}" ]]; then
  [[ -x "$WORK/venv/bin/python" ]] || "$PYTHON" -m venv "$WORK/venv"
  VPY="$WORK/venv/bin/python"
  "$VPY" -m pip install -q --upgrade pip
  "$VPY" -m pip install -q "$TORCH_SPEC" setuptools wheel packaging ninja
fi
TORCH_CUDA=$("$VPY" -c "import torch; print(torch.version.cuda or '')")
echo "== torch $("$VPY" -c 'import torch; print(torch.__version__)'), built for CUDA ${TORCH_CUDA:-none}"
[[ "${TORCH_CUDA%%.*}" == "${NVCC_RELEASE%%.*}" ]] \
  || { echo "torch's CUDA ${TORCH_CUDA:-none} and nvcc $NVCC_RELEASE differ in major version: the extensions would not load" >&2; exit 2; }

# the sources (metadata is prepared without compiling: *_SKIP_CUDA_BUILD)
if [[ -n "${SDIST:-}" ]]; then
  mkdir -p "$WORK/sdist" && cp "$SDIST"/causal_conv1d-1.7.0.tar.gz "$SDIST"/mamba_ssm-2.3.2.post1.tar.gz "$WORK/sdist/"
else
  CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE \
    "$VPY" -m pip download -q --no-deps --no-build-isolation -d "$WORK/sdist" "${PKGS[@]}"
fi
rm -rf "$WORK/src" && mkdir -p "$WORK/src"
for f in "$WORK"/sdist/causal_conv1d-1.7.0.tar.gz "$WORK"/sdist/mamba_ssm-2.3.2.post1.tar.gz; do tar xzf "$f" -C "$WORK/src"; done

# keep only ARCHS in the hard-coded -gencode lists; refuse a source whose list no longer looks as expected
"$VPY" - "$WORK/src" $ARCHS <<'EOF'
import re, sys
from pathlib import Path
src, archs = Path(sys.argv[1]), set(sys.argv[2:])
pair = re.compile(r'(?m)^([ \t]*)cc_flag\.append\("-gencode"\)\n[ \t]*cc_flag\.append\("arch=compute_(\d+),code=sm_\2"\)\n')
for setup in sorted(src.glob("*/setup.py")):
    text = setup.read_text()
    found = {arch for _, arch in pair.findall(text)}
    if not archs <= found:
        sys.exit(f"{setup}: its -gencode list {sorted(found)} lacks {sorted(archs - found)}: the source changed, check it")
    # a dropped pair becomes `pass`, so an `if` whose only flags were dropped stays valid Python
    text = pair.sub(lambda m: m.group(0) if m.group(2) in archs else f"{m.group(1)}pass  # sm_{m.group(2)} not built\n", text)
    # torch 2.14's headers refuse C++17 ("#error C++20 or later compatible compiler is required to use ATen",
    # ATen/ATen.h): mamba_ssm's selective_scan failed so on this script's first full run; both setup.py pin c++17
    text = text.replace('"-std=c++17"', '"-std=c++20"')
    compile(text, str(setup), "exec")
    setup.write_text(text)
    print(f"== {setup.parent.name}: -gencode kept for sm_{', sm_'.join(sorted(archs))} (of {len(found)})")
EOF
export TORCH_CUDA_ARCH_LIST=$(for a in $ARCHS; do printf '%s.%s;' "${a:0:${#a}-1}" "${a: -1}"; done | sed 's/;$//')
export CAUSAL_CONV1D_FORCE_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE
echo "== TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"
# each setup.py's own view, without compiling: it probes nvcc and lists its extensions' -gencode flags (setup() stubbed)
for d in "$WORK"/src/causal_conv1d-1.7.0 "$WORK"/src/mamba_ssm-2.3.2.post1; do
  (cd "$d" && "$VPY" - $ARCHS <<'EOF'
import os, runpy, sys
import setuptools
from torch.utils.cpp_extension import CUDA_HOME

want, seen = {f"arch=compute_{a},code=sm_{a}" for a in sys.argv[1:]}, {}
setuptools.setup = lambda **kw: seen.update(kw)
sys.argv = ["setup.py", "bdist_wheel"]
runpy.run_path("setup.py", run_name="__main__")
for ext in seen.get("ext_modules") or []:
    archs = {a for a in ext.extra_compile_args["nvcc"] if a.startswith("arch=")}
    assert archs == want, f"{ext.name}: -gencode {sorted(archs)}, expected {sorted(want)}"
    print(f"== {os.path.basename(os.getcwd())}: extension {ext.name}, {len(ext.sources)} sources, nvcc at {CUDA_HOME}, {sorted(archs)}")
if not seen.get("ext_modules"):
    sys.exit(f"{os.getcwd()}/setup.py declares no CUDA extension: *_SKIP_CUDA_BUILD set, or the source changed")
EOF
  )
done
# the one dependency of theirs the lab's wheel set lacks (mamba_ssm's Triton scan imports einops; lab.kaggle.kernel
# MAMBA_EXTRA_DEP installs it with the two wheels, --no-deps: tilelang / quack-kernels are optional imports)
[[ -n "${SDIST:-}" ]] || "$VPY" -m pip download -q --no-deps --only-binary=:all: -d "$OUT" "einops==0.8.2"
if (( PREPARE_ONLY )); then
  echo "== prepared in $WORK (sources patched, nothing compiled); run without --prepare-only to build"
  exit 0
fi

for d in "$WORK"/src/causal_conv1d-1.7.0 "$WORK"/src/mamba_ssm-2.3.2.post1; do
  name=$(basename "$d"); whl_glob="${name%-*}-${name##*-}-cp${PYTHON_VERSION/./}-*.whl"
  # a rerun after a failure keeps the wheel already built (REBUILD=1 builds it again)
  if [[ "${REBUILD:-0}" != 1 ]] && compgen -G "$OUT/$whl_glob" >/dev/null; then
    echo "== $name: kept $(basename "$(compgen -G "$OUT/$whl_glob" | head -1)") (REBUILD=1 builds it again)"; continue
  fi
  echo "== building $name"
  start=$(date +%s)
  "$VPY" -m pip wheel --no-build-isolation --no-deps -w "$OUT" "$d"
  echo "== $(basename "$d"): $(( $(date +%s) - start )) s"
done
if [[ "${STRIP:-0}" == 1 ]]; then  # symbols off every shared library, the wheel's RECORD written again (wheel pack)
  for w in "$OUT"/causal_conv1d-*.whl "$OUT"/mamba_ssm-*.whl; do
    rm -rf "$WORK/strip" && "$VPY" -m wheel unpack -d "$WORK/strip" "$w"
    find "$WORK/strip" -name '*.so' -exec strip --strip-unneeded {} +
    rm "$w" && "$VPY" -m wheel pack -d "$OUT" "$WORK"/strip/*
  done
fi
ls -la "$OUT"/causal_conv1d-*.whl "$OUT"/mamba_ssm-*.whl
