"""Training: SFT, GRPO and what keeps them honest.

  sft             the SFT warm-up: a LoRA adapter on solver traces, TRL's SFTTrainer over PEFT
  sft_unsloth     `sft.backend=unsloth`: Unsloth's own loader (GPU only)
  grpo            GRPO from the SFT adapter with TRL's GRPOTrainer: budget, micro-batching, resume fingerprint
  grpo_refine     iterative refinement for GRPO (`grpo.refine`), a TRL rollout_func
  grpo_packed     `grpo.packing`: a step's completions trained in packs, TRL's loss types computed pack by pack
  rewards         GRPO reward functions, a name-to-function registry
  callbacks       trainer callbacks SFT and GRPO share, and GRPO's guard rails
  checkpoints     resumable checkpoints: fingerprinted, counted only when complete
  launch          the end of a training launch: the main process left to evaluate alone
  trl_private     every use of TRL 1.15's private API, in one place
"""
