"""Training: SFT, GRPO and what keeps them honest.

  sft             the SFT warm-up: a LoRA adapter on solver traces, TRL's SFTTrainer over PEFT
  sft_unsloth     `sft.backend=unsloth`: Unsloth's own loader (GPU only)
  grpo            GRPO from the SFT adapter with TRL's GRPOTrainer: budget, micro-batching, resume fingerprint
  grpo_refine     iterative refinement for GRPO (`grpo.refine`), a TRL rollout_func
  grpo_packed     `grpo.packing`: a step's completions trained in packs, TRL's loss types computed pack by pack
  rewards         GRPO reward functions, a name-to-function registry
  callbacks       trainer callbacks SFT and GRPO share, and GRPO's guard rails
  checkpoints     resumable checkpoints: fingerprinted, counted only when complete
  memory          one training step traced on fake tensors: peak GPU memory, does it fit the gpu= card
  memory_cli      `python -m lab memory`'s command line, apart so that its --help imports no torch
  estimate        projected SFT speed and hours on the gpu= card, before anything loads (`python -m lab estimate`)
  autocast_rules  CUDA's autocast casts on the CPU, for the memory trace
  preflight       before a real-model stage: GPU packages, CUDA, the model folder, as one list of what is missing
  trl_private     every use of TRL 1.15's private API, in one place
"""
