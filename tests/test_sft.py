"""SFT guarantees on the tiny model (CPU, offline, a few optimiser steps each)."""

from __future__ import annotations

import os
import shutil

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

from lab.train import callbacks, sft  # noqa: E402
from lab.core import config
from lab.model import lora, models
from lab.core import paths
from lab import LabError
from lab.core.run import Stage  # noqa: E402
from lab.competition.prompts import chat_prompt, user_message  # noqa: E402
from lab.puzzles import generate, solve  # noqa: E402
from train_steps import sft_train  # noqa: E402  (tests/train_steps.py: the recipe's training steps)

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "out_proj", "shared_experts.up_proj",
       "shared_experts.down_proj", "experts"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("sft")


def compose(root, name="run", *extra):
    return config.compose([f"run_dir={root / name}", f"model.path={root / 'base_model'}", "sft.batch_size=2",
                           "sft.logging_steps=1", "sft.save_steps=3", "sft.max_steps=3", *extra])


@pytest.fixture(scope="module")
def puzzles():
    return generate("numeral_system", 6, 0)


def layers_of(model, kind):
    """Indices of the layers whose mixer is of `kind` ("Mamba2Mixer", "Attention", "MoE"), whatever the tiny layout."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return [i for i, layer in enumerate(base.model.layers) if type(layer.mixer).__name__.endswith(kind)]


def load(root, *extra):
    cfg = compose(root, "run", *extra)
    model, tok = models.load(cfg)
    return cfg, model, tok


# ---- target table and configuration errors -----------------------------------------------------

def test_target_table_lists_every_configured_family(root):
    cfg, model, tok = load(root)
    assert sorted(str(t) for t in cfg.sft.lora.targets) == sorted(ALL)
    pm, table = lora.attach_lora(cfg, model)
    rows = table.set_index("family")
    assert sorted(rows.index) == sorted(ALL)
    n_att, n_mamba, n_moe = (len(layers_of(model, k)) for k in ("Attention", "Mamba2Mixer", "MoE"))
    assert n_att and n_mamba and n_moe
    expect = {"q_proj": n_att, "k_proj": n_att, "v_proj": n_att, "o_proj": n_att, "in_proj": n_mamba,
              "out_proj": n_mamba, "shared_experts.up_proj": n_moe, "shared_experts.down_proj": n_moe,
              "experts": 2 * n_moe}  # two fused parameters per MoE layer
    assert rows["modules"].to_dict() == expect
    r, a = 32, model.config
    assert rows.loc["q_proj", "trainable_params"] == n_att * r * (a.hidden_size + a.num_attention_heads * a.head_dim)
    per_param = r * a.n_routed_experts * (a.hidden_size + a.moe_intermediate_size)
    assert rows.loc["experts", "trainable_params"] == 2 * n_moe * per_param
    assert rows["trainable_params"].sum() == sum(p.numel() for p in pm.parameters() if p.requires_grad)


def test_unknown_family_names_the_modules_that_exist(root):
    cfg, model, _ = load(root, "sft.lora.targets=[q_proj,gate_proj]")
    with pytest.raises(LabError) as e:
        lora.attach_lora(cfg, model)
    msg = str(e.value)
    assert "'gate_proj'" in msg and "no such module exists" in msg
    for fam in ("q_proj", "in_proj", "out_proj", "experts", "shared_experts.up_proj"):
        assert fam in msg


def test_rank_above_32_is_refused(root):
    with pytest.raises(LabError, match=r"sft.lora.r=64 must be <= 32"):
        load(root, "sft.lora.r=64")  # at compose time (issue 19)
    cfg, model, _ = load(root)
    cfg.sft.lora.r = 64  # changed after compose: the stage it opens validates it again (the rank's one check)
    with pytest.raises(LabError, match=r"sft.lora.r=64 must be <= 32"):
        Stage("02_sft", cfg=cfg)


def test_unsloth_backend_without_unsloth_is_a_clear_error(root, puzzles):
    import importlib.util

    if importlib.util.find_spec("unsloth") is not None:
        pytest.skip("unsloth is installed here")
    cfg = compose(root, "unsloth", "sft.backend=unsloth")
    with pytest.raises(LabError, match=r"backend=unsloth needs the `unsloth` package.*sft\.backend=hf"):
        sft_train(cfg, Stage("02_sft", cfg=cfg), puzzles)


# ---- the SFT data --------------------------------------------------------------------------------

def test_assistant_turn_renders_byte_for_byte_as_planned(root, puzzles):
    cfg, model, tok = load(root)
    examples, counts = sft.sft_examples(tok, puzzles, 10_000)
    assert counts["kept"] == len(puzzles) == len(examples)
    for (_, ex), (_, pz) in zip(examples.iterrows(), puzzles.iterrows()):
        expected_prompt = tok.apply_chat_template([{"role": "user", "content": user_message(pz["prompt"])}],
                                                  tokenize=False, add_generation_prompt=True, enable_thinking=True)
        assert ex["prompt"] == expected_prompt == chat_prompt(tok, pz["prompt"])
        assert ex["prompt"].endswith("<|im_start|>assistant\n<think>\n")
        assert ex["completion"] == solve(pz["prompt"]).trace + tok.eos_token
        p_ids = tok(ex["prompt"], add_special_tokens=False)["input_ids"]
        pc_ids = tok(ex["prompt"] + ex["completion"], add_special_tokens=False)["input_ids"]
        assert pc_ids[:len(p_ids)] == p_ids
    # what TRL actually trains on: the loss mask starts exactly where the prompt's tokens end
    from lab.train import trl_private

    trl_private.install()
    pm, _ = lora.attach_lora(cfg, model)
    trainer = sft.build_trainer(cfg, root / "render_ck", pm, tok, examples)
    for row, (_, ex) in zip(trainer.train_dataset, examples.iterrows()):
        p_ids = tok(ex["prompt"], add_special_tokens=False)["input_ids"]
        assert row["input_ids"] == tok(ex["prompt"] + ex["completion"], add_special_tokens=False)["input_ids"]
        mask = [int(label != -100) for label in row["labels"]]  # TRL folds completion_mask into labels
        assert mask.index(1) == len(p_ids) and set(mask[len(p_ids):]) == {1}
        assert row["labels"][len(p_ids):] == row["input_ids"][len(p_ids):]
        assert tok.decode([i for i, m in zip(row["input_ids"], mask) if m]) == ex["completion"]


def test_overlong_examples_are_counted_and_dropped_not_cut(root, puzzles):
    _, _, tok = load(root)
    full, _ = sft.sft_examples(tok, puzzles, 10_000)
    limit = int(sorted(full["tokens"])[len(full) // 2])
    kept, counts = sft.sft_examples(tok, puzzles, limit)
    n_over = int((full["tokens"] > limit).sum())
    assert 0 < n_over < len(full)
    assert counts["overlong"] == n_over and counts["kept"] == len(kept) == len(full) - n_over
    assert (kept["tokens"] <= limit).all()
    for _, ex in kept.iterrows():  # kept examples are whole
        assert ex["completion"] == full.set_index("id").loc[ex["id"], "completion"]
        assert ex["completion"].endswith(tok.eos_token)


# ---- the fused Mamba kernel guard ----------------------------------------------------------------

@pytest.mark.slow  # real SFTTrainer steps: seconds (the fast lane stays short)
def test_fused_mamba_kernel_is_bypassed_for_mixers_with_an_out_proj_lora(root, puzzles, monkeypatch):
    """With mamba_ssm, training calls mamba2_split_conv1d_scan_combined(..., outproj_weight=...) and returns
    its output, bypassing out_proj. A sentinel stands in for that kernel here."""
    import transformers.models.nemotron_h.modeling_nemotron_h as mh

    from lab.train import trl_private

    trl_private.install()
    calls = []

    def sentinel(zxbcdt, *args, outproj_weight=None, rmsnorm_weight=None, **kwargs):  # mamba_ssm's fused kernel,
        calls.append(outproj_weight)  # as far as shapes go; without outproj_weight: the gated-normed output's shape
        if outproj_weight is None:  # (a differentiable stand-in: the gate part of in_proj's output)
            return zxbcdt[..., :rmsnorm_weight.shape[0]] * rmsnorm_weight
        return torch.zeros(*zxbcdt.shape[:2], outproj_weight.shape[0])

    x = torch.randint(5, 300, (2, 24))

    def one_trainer_step(cfg, pm, tok, name):
        examples, _ = sft.sft_examples(tok, puzzles.head(2), 10_000)
        trainer = sft.build_trainer(compose(root, name, "sft.max_steps=1", "sft.save_steps=100", "sft.warmup_ratio=0"),
                                    root / name / "ck", pm, tok, examples)
        trainer.train()

    # without an out_proj LoRA the "kernel" runs for both Mamba layers, in SFTTrainer's training step too
    monkeypatch.setattr(mh, lora.FUSED_FN, sentinel)
    cfg, model, tok = load(root, "sft.lora.targets=[q_proj,in_proj]")
    pm, _ = lora.attach_lora(cfg, model)
    assert isinstance(getattr(mh, lora.FUSED_FN), lora._FusedScanGuard)
    pm.train()
    pm(input_ids=x, use_cache=False)  # SFTTrainer passes use_cache=False; a cache disables the fused branch
    mamba = layers_of(pm, "Mamba2Mixer")
    assert len(calls) == len(mamba) >= 2
    calls.clear()
    one_trainer_step(cfg, pm, tok, "guard_off")
    assert len(calls) >= len(mamba)

    # with an out_proj LoRA it runs without out_proj (outproj_weight=None) and the mixer's out_proj (with its LoRA)
    # follows (lab.model.lora._FusedScanGuard, issue 42)
    calls.clear()
    monkeypatch.setattr(mh, lora.FUSED_FN, sentinel)
    cfg, model, tok = load(root, "sft.lora.targets=[q_proj,in_proj,out_proj]")
    pm, _ = lora.attach_lora(cfg, model)
    mamba = layers_of(pm, "Mamba2Mixer")
    assert lora.guard_fused_mamba_out_proj(pm) == len(mamba)  # installing again must not double-wrap
    assert getattr(mh, lora.FUSED_FN).inner is sentinel
    pm.train()
    for i in mamba:  # B=0 at init would hide A's gradient
        torch.nn.init.normal_(pm.base_model.model.model.layers[i].mixer.out_proj.lora_B["default"].weight)
    pm.zero_grad()
    loss = pm(input_ids=x, labels=x, use_cache=False).loss
    loss.backward()
    assert len(calls) == len(mamba) and all(c is None for c in calls) and loss.isfinite()
    for i in mamba:
        op = pm.base_model.model.model.layers[i].mixer.out_proj
        assert op.lora_A["default"].weight.grad.abs().sum() > 0
        assert op.lora_B["default"].weight.grad.abs().sum() > 0
    before = {i: pm.base_model.model.model.layers[i].mixer.out_proj.lora_A["default"].weight.detach().clone()
              for i in mamba}
    pm.zero_grad()
    calls.clear()
    one_trainer_step(cfg, pm, tok, "guard_on")
    assert len(calls) >= len(mamba) and all(c is None for c in calls)
    for i in mamba:
        assert not torch.equal(pm.base_model.model.model.layers[i].mixer.out_proj.lora_A["default"].weight, before[i])


# ---- training: gradient check, resume, wall-clock budget -----------------------------------------

def _stop_at(step):
    from transformers import TrainerCallback

    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step >= step:
                control.should_training_stop = True
            return control

    return Stop()


def _adapter(cfg):
    from safetensors.torch import load_file

    return load_file(str(paths.resolve_path(cfg.sft.adapter_dir) / "adapter_model.safetensors"))


@pytest.mark.slow
def test_gradient_check_and_resume_reach_the_same_adapter(root, puzzles, monkeypatch):
    common = ("sft.max_steps=6", "sft.save_steps=3", "sft.resume=true")
    # uninterrupted: 6 steps
    cfg_a = compose(root, "uninterrupted", *common)
    model, tok = models.load(cfg_a)
    att, mamba, moe = (layers_of(model, k)[0] for k in ("Attention", "Mamba2Mixer", "MoE"))
    L = model.model.layers
    frozen = {"embeddings": model.model.embeddings.weight, "lm_head": model.lm_head.weight,
              "q_proj": L[att].mixer.q_proj.weight, "out_proj": L[mamba].mixer.out_proj.weight,
              "experts.up_proj": L[moe].mixer.experts.up_proj, "conv1d": L[mamba].mixer.conv1d.weight,
              "router": L[moe].mixer.gate.weight}
    frozen_before = {k: v.detach().clone() for k, v in frozen.items()}
    st_a = Stage("02_sft", cfg=cfg_a)
    m_a, pm, _, log = sft_train(cfg_a, st_a, puzzles, model, tok)
    assert m_a["steps"] == 6 and not m_a["stopped_by_budget"] and len(log) == 6

    # the gradient check passed for every family, every LoRA tensor moved, sampled frozen tensors did not
    assert m_a["gradient_check_failed"] == []
    import pandas as pd

    rep = pd.read_csv(st_a.path("gradient_check.csv"))
    assert sorted(rep["family"]) == sorted(ALL) and rep["ok"].all() and (rep["tensors_unchanged"] == 0).all()
    fz = pd.read_csv(st_a.path("frozen_check.csv"))
    assert fz["unchanged"].all() and len(fz) >= 15
    assert any("embeddings" in t for t in fz["tensor"]) and any("experts.base_layer.base_layer.up_proj" in t
                                                                for t in fz["tensor"])
    # and explicitly, as TRL's tests do: frozen base tensors are bit-identical, LoRA tensors all moved
    for k, before in frozen_before.items():
        assert torch.equal(frozen[k].detach(), before), k
    for n, p in pm.named_parameters():
        if p.requires_grad:
            assert "lora_" in n
            assert p.detach().abs().sum() > 0, n  # lora_B starts at 0: it moved
    a = _adapter(cfg_a)
    assert any(".experts.base_layer.lora_A" in k for k in a) and any(".out_proj.lora_B" in k for k in a)

    # interrupted after the checkpoint at step 3, then rerun with resume=true
    cfg_b = compose(root, "interrupted", *common)
    original = callbacks.trainer_callbacks
    monkeypatch.setattr(callbacks, "trainer_callbacks", lambda *args: original(*args) + [_stop_at(3)])
    m_b1, *_ = sft_train(cfg_b, Stage("02_sft", cfg=cfg_b), puzzles)
    assert m_b1["steps"] == 3
    ck = paths.resolve_path(cfg_b.run_dir) / "checkpoints" / "02_sft"
    assert (ck / "checkpoint-3" / "adapter_model.safetensors").is_file()
    monkeypatch.setattr(callbacks, "trainer_callbacks", original)
    m_b2, *_ = sft_train(cfg_b, Stage("02_sft", cfg=cfg_b), puzzles)
    assert m_b2["steps"] == 6 and m_b2["resumed_from"].endswith("checkpoint-3")
    b = _adapter(cfg_b)
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
    # the adapter after step 3 differs from the final one: the resumed run really trained
    from safetensors.torch import load_file

    c3 = load_file(str(ck / "checkpoint-3" / "adapter_model.safetensors"))
    assert any(not torch.equal(c3[k], b[k]) for k in b)

    # resume=false starts afresh: the old checkpoints are gone
    cfg_c = compose(root, "interrupted", "sft.max_steps=1", "sft.resume=false", "sft.gradient_check=false")
    m_c, *_ = sft_train(cfg_c, Stage("02_sft", cfg=cfg_c), puzzles)
    assert m_c["resumed_from"] is None and m_c["steps"] == 1 and not (ck / "checkpoint-3").exists()


@pytest.mark.slow  # a real SFT run that saves a checkpoint: seconds (the fast lane stays short)
def test_wall_clock_budget_saves_and_stops_cleanly(root, puzzles):
    cfg = compose(root, "budget", "sft.max_steps=5", "sft.save_steps=100", "sft.wall_clock_budget_min=1e-6",
                  "sft.gradient_check=false")
    m, *_ = sft_train(cfg, Stage("02_sft", cfg=cfg), puzzles)
    assert m["stopped_by_budget"] and m["steps"] == 1 < m["max_steps"] == 5
    ck = paths.resolve_path(cfg.run_dir) / "checkpoints" / "02_sft" / "checkpoint-1"
    for f in ("adapter_model.safetensors", "optimizer.pt", "trainer_state.json"):
        assert (ck / f).is_file(), f
    assert (paths.resolve_path(cfg.sft.adapter_dir) / "adapter_model.safetensors").is_file()
    shutil.rmtree(paths.resolve_path(cfg.run_dir))


@pytest.mark.slow
def test_drills_phase_trains_first_and_the_traces_continue_its_adapter(root, puzzles):
    from safetensors.torch import load_file

    cfg = compose(root, "drills", "sft.phases=[drills,traces]", "sft.drill_n=8", "sft.max_steps=2",
                  "sft.save_steps=100", "sft.gradient_check=false", "sft.resume=false")
    m, *_ = sft_train(cfg, Stage("02_sft", cfg=cfg), puzzles)
    assert 0 < m["drills"]["examples"] <= 8 and m["drills"]["steps"] == 2 and m["steps"] == 2
    final_dir = paths.resolve_path(cfg.sft.adapter_dir)
    drills = load_file(str(final_dir.parent / "drills_adapter" / "adapter_model.safetensors"))
    final = load_file(str(final_dir / "adapter_model.safetensors"))
    assert drills.keys() == final.keys()
    b = [k for k in drills if "lora_B" in k]
    assert any(drills[k].abs().sum() > 0 for k in b)  # the drills moved the adapter off its zero init
    assert any(not torch.equal(drills[k], final[k]) for k in drills)  # and the traces went on from there
    shutil.rmtree(paths.resolve_path(cfg.run_dir))
