"""Planning, before anything loads: will it fit, how long will it take, what will Kaggle keep. Imports no trainer.

  shapes          the model's config.json values, parameter counts on the meta device, the card's memory, the bytes
                  a parameter takes in the optimizer and in a checkpoint (nemotron_3_nano_config.json: the measured
                  model's published values, shipped with the package)
  memory          one training step traced on fake tensors: peak GPU memory, does it fit the gpu= card
  memory_cli      `python -m lab memory`'s command line, apart so that its --help imports no torch
  grpo_policy     GRPO's runtime choices from config and the card: micro-batch, the vLLM engine's memory share,
                  sequences and sleep level, and the generation phase's memory bound they come from
  estimate        projected SFT, GRPO, evaluation and vote hours on the gpu= card (`python -m lab estimate`)
  estimate_infer  projected generation time for evaluation, voting and GRPO rollouts
  output_plan     what each stage writes against Kaggle's 20 GB of /kaggle/working
  preflight       before a real-model stage: GPU packages, CUDA, the model folder, as one list of what is missing
  autocast_rules  CUDA's autocast casts on the CPU, for the memory trace
"""
