"""What the vLLM lane's tests record for the summary printed at the end of the run (conftest.py)."""

PARITY_ROWS: list[dict] = []   # one per adapter: test_vllm_parity.py
REFUSAL_ROWS: list[dict] = []  # one per refused case: test_vllm_refusals.py
ROLLOUT_ROWS: list[dict] = []  # one per rollout round or check: test_vllm_rollouts.py
