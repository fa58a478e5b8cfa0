"""The Nemotron reasoning lab: the logic behind the notebooks.

Modules, by what they do:
  config      Hydra config, seeds, stage folders, manifests, atomic writes
  metric      the competition's scorer, to the character
  prompts     the exact Kaggle prompt and chat-template rendering
  data        loading, validating and splitting puzzle files
  puzzles     per-category parsers, solvers, trace writers and generators
  models      loading the base model (or building the tiny one) and adapters
  generate    one generation interface: transformers on CPU/GPU, vLLM on GPU
  sft         the supervised warm-up (TRL SFTTrainer + PEFT LoRA)
  rewards     GRPO reward functions, a name-to-function registry
  grpo        reinforcement learning (TRL GRPOTrainer)
  vote        inference-time voting and pass@k / maj@k
  errors      error analysis: per-category accuracy, failure taxonomy
  submission  packing and checking the Kaggle submission.zip
  sweep       papermill sweeps and reports across runs
  kaggle      building offline Kaggle kernels
"""

__version__ = "0.1.0"
