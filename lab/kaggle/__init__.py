"""The Kaggle side: offline kernels and the pre-submission gate.

  kernel  offline kernels and the dependency dataset they install from (`python -m lab kaggle dataset|build`)
  run     a chain of kernels pushed, waited for and fetched one after the other (`python -m lab kaggle run`)
  gate    a submission.zip served by vLLM as the scorer does: accuracy with and without, each LoRA family's reach
          (`python -m lab gate`)
"""
