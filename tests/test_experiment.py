"""The competition recipe: `experiment=competition` with `model=nemotron_nano data=competition` pins every value;
`model=nemotron_nano` alone no longer inherits the tiny demo's training settings; the preset works in a sweep."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from lab.config import compose
from lab.paths import project_root

PRESET = ["model=nemotron_nano", "experiment=competition", "data=competition"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "out_proj", "shared_experts.up_proj",
           "shared_experts.down_proj", "experts", "lm_head"]


def test_the_preset_pins_the_competition_recipe():
    c = compose(PRESET)
    m, s, g, i = c.model, c.sft, c.grpo, c.infer
    assert (m.name, m.path, m.build_tiny, m.trust_remote_code) == (
        "nemotron_nano", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", False, False)
    assert (m.dtype, m.max_model_len, m.generation_backend, m.train_backend) == ("bfloat16", 8192, "vllm", "hf")
    assert (c.data.source, c.data.path, c.data.val_fraction) == ("competition", None, 0.1)
    assert c.run_name == "competition" and c.run_dir == "outputs/competition"
    # LoRA: r 32, alpha 32, every family vLLM serves for Nemotron-H, lm_head included
    assert (s.backend, s.lora.r, s.lora.alpha, s.lora.dropout) == ("hf", 32, 32, 0.0)
    assert list(s.lora.targets) == TARGETS
    # optimisation: lr 2e-4 cosine, 1 epoch, effective batch 16, 8,192 tokens, gradient checkpointing
    assert (s.learning_rate, s.lr_scheduler_type, s.warmup_ratio, s.weight_decay) == (2e-4, "cosine", 0.05, 0.0)
    assert (s.epochs, s.max_steps, s.n_train) == (1, -1, None)
    assert (s.batch_size, s.grad_accum) == (1, 16) and s.batch_size * s.grad_accum == 16
    assert s.max_seq_len == 8192 and s.gradient_checkpointing is True
    # checkpoints every N steps with resume, the gradient check on
    assert (s.save_steps, s.save_total_limit, s.resume, s.wall_clock_budget_min) == (25, 2, True, 0)
    assert (s.logging_steps, s.gradient_check) == (5, True)
    assert s.adapter_dir == "outputs/competition/02_sft/adapter"
    # GRPO sized for the real model, not the tiny demo's 20 steps at 1e-4
    assert (g.rollout_backend, g.num_generations, g.prompts_per_step, g.max_steps) == ("hf", 8, 8, 100)
    assert (g.learning_rate, g.n_prompts, g.save_steps, g.resume, g.gradient_checkpointing) == (1e-5, 512, 5, True,
                                                                                                 True)
    assert g.init_adapter == s.adapter_dir
    # every evaluation: the Kaggle scoring settings
    assert OmegaConf.to_container(i) == OmegaConf.to_container(compose(["infer=kaggle"]).infer)
    assert (i.temperature, i.top_p, i.max_tokens, i.max_model_len, i.max_num_seqs) == (0.0, 1.0, 7680, 8192, 64)
    assert (i.max_lora_rank, i.gpu_memory_utilization, i.metric_version) == (32, 0.85, "final") and "n" not in i
    assert s.lora.r <= i.max_lora_rank


def test_the_preset_alone_and_in_any_order_gives_the_same_recipe():
    want = OmegaConf.to_container(compose(PRESET))
    assert OmegaConf.to_container(compose(["experiment=competition"])) == want
    assert OmegaConf.to_container(compose(["data=competition", "experiment=competition", "model=nemotron_nano"])) == want
    # an explicit override still wins
    assert compose([*PRESET, "sft.learning_rate=1e-4"]).sft.learning_rate == 1e-4


def test_the_real_model_never_inherits_the_tiny_demos_training_settings():
    tiny = compose([])
    assert (tiny.sft.learning_rate, tiny.sft.batch_size, tiny.grpo.max_steps) == (1e-2, 8, 20)  # the demo's
    real = compose(["model=nemotron_nano", "run_name=r"])  # one run folder: adapter_dir derives from it
    assert OmegaConf.to_container(real.sft) == OmegaConf.to_container(compose([*PRESET, "run_name=r"]).sft)
    assert (real.sft.learning_rate, real.sft.batch_size, real.grpo.max_steps) == (2e-4, 1, 100)


def test_sft_default_points_at_a_file_that_exists():
    text = (project_root() / "conf" / "sft" / "default.yaml").read_text()
    assert "sft/nemotron_nano.yaml" in text and (project_root() / "conf" / "sft" / "nemotron_nano.yaml").is_file()


def test_the_preset_composes_under_the_sweep_command(tmp_path: Path):
    from lab import sweep as sw

    p = sw.plan(["experiment=competition", "sft.learning_rate=1e-4,2e-4"], seeds=1)
    assert p["named"] == ["sft.learning_rate", "seed"] and "experiment" in p["fixed"]
    seen = sw.multirun(sw.hydra_overrides(p, tmp_path / "s", "basic"),
                       lambda cfg: (cfg.model.name, cfg.sft.learning_rate, cfg.sft.grad_accum, cfg.data.source))
    assert sorted(seen) == [("nemotron_nano", 1e-4, 16, "competition"), ("nemotron_nano", 2e-4, 16, "competition")]
