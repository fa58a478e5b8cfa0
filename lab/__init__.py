"""The Nemotron reasoning lab: the logic behind the notebooks.

Modules, by what they do (top to bottom, as the import contract in pyproject.toml layers them):
  config      compose and validate the Hydra config; schema: every key's type, help, range and cross-key rule, and
              the competition's fixed limits (`competition`)
  run         a run and its stages: Stage, stage inputs and outputs, the manifest, the run lock, seeding, report_to
  paths       where the data file, the Kaggle mount and the model are; io: atomic writes
  lineage     content hashes of what a stage read and wrote; checkpoints: resuming training safely
  metric      the competition's scorer, to the character
  prompts     the exact Kaggle prompt and chat-template rendering
  data        loading, validating and splitting puzzle files
  puzzles     per-category parsers, solvers, trace writers and generators
  models      loading the base model (or building the tiny one) and adapters
  generate    one generation interface: transformers on CPU/GPU, vLLM on GPU
  sft         the supervised warm-up (TRL SFTTrainer + PEFT LoRA); sft_unsloth: the GPU back-end
  lora        the LoRA family table, attaching the adapter, the out_proj and lm_head guards, the gradient check,
              saving; callbacks: the trainer callbacks SFT and GRPO share
  packed_rows packed SFT rows made exact for Nemotron-H: each row's Mamba state and attention start at its own
              first token (seq_idx to the kernels on GPU, one mixer call per row on CPU)
  memory      one training step traced on fake tensors: peak GPU memory, does it fit the gpu= card
  rewards     GRPO reward functions, a name-to-function registry
  curriculum  pass-rate selection and easy-to-hard ordering of GRPO prompts
  grpo        reinforcement learning (TRL GRPOTrainer) and its resume fingerprint; grpo_refine: iterative refinement
  vote        inference-time voting and pass@k / maj@k
  analysis    error analysis: per-category accuracy, failure taxonomy; stats: the Wilson interval;
              cli: the small commands `score`, `compare`, `sweep` and `report`
  submission  packing the Kaggle submission.zip (and its CLI); submission_check: checking one; gate: the zip served
              by a real vLLM engine (its CPU build; vllm_cpu)
  sweep       sweeps across runs (stages run by pipeline's one stage runner); sweep_report: one report across them
  kaggle      building offline Kaggle kernels
  pipeline    the one stage runner (papermill), the five notebooks headless (`python -m lab demo`), the summary
  stages      one function per stage (what each notebook and its script run), the greedy evaluation cache
  plots       every plot of the lab (stages, errors, voting, sweeps) in one style, and the PNG writer
  trl_private every use of TRL 1.15's private API (the CPU log-prob head, GRPO rollout internals)
  console     progress lines (training steps, generation) and known library warnings said once
  preflight   before a real-model stage: GPU packages, CUDA, model folder, as one list of what is missing
"""

__version__ = "0.1.0"


class LabError(Exception):
    """An error whose message names the file and the problem; shown to users as is."""

