"""Planning, before anything loads: will it fit, how long will it take, what will Kaggle keep.

  memory          one training step traced on fake tensors: peak GPU memory, does it fit the gpu= card
  memory_cli      `python -m lab memory`'s command line, apart so that its --help imports no torch
  estimate        projected SFT, GRPO, evaluation and vote hours on the gpu= card (`python -m lab estimate`)
  estimate_infer  projected generation time for evaluation, voting and GRPO rollouts
  output_plan     what each stage writes against Kaggle's 20 GB of /kaggle/working
  preflight       before a real-model stage: GPU packages, CUDA, the model folder, as one list of what is missing
  autocast_rules  CUDA's autocast casts on the CPU, for the memory trace
"""
