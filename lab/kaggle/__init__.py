"""The Kaggle side: offline kernels and the pre-submission gate.

  kernel  offline kernels and the dependency dataset they install from (`python -m lab kaggle dataset|build`)
  gate    a submission.zip served by vLLM as the scorer does: accuracy with and without, each LoRA family's reach
          (`python -m lab gate`)
"""
