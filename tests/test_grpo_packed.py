"""Packed GRPO training (lab.train.grpo_packed) against TRL 1.15's own unpacked loss, on the tiny Nemotron-H with the
lab's LoRA: for each loss type the lab offers, the loss and every LoRA gradient of the packed micro-batch against an
fp64 reference (TRL's unpacked computation in float64), within a small multiple of TRL's own fp32 error; the negative
control (the same packs without row boundaries) lies at least 1,000x beyond that bound. CPU, a few seconds a case."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from lab.core import config  # noqa: E402
from lab.model import lora, models, packed_rows  # noqa: E402
from lab.train import grpo, grpo_packed, trl_private  # noqa: E402

EPS32 = torch.finfo(torch.float32).eps
LOSS_TYPES = grpo_packed.LOSS_TYPES


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A real GRPOTrainer on the tiny model with the lab's LoRA, and one synthetic micro-batch in TRL's layout."""
    from datasets import Dataset
    from trl import GRPOTrainer

    root = tmp_path_factory.mktemp("grpo_packed")
    cfg = config.compose([f"run_dir={root / 'run'}", f"model.path={root / 'base_model'}", "grpo.num_generations=4",
                          "grpo.prompts_per_step=2", "grpo.steps_per_generation=2"])
    torch.manual_seed(0)
    model, tok = models.load(cfg)
    pm, _ = lora.attach_lora(cfg, model)
    for n, p in pm.named_parameters():  # LoRA B starts at zero: give every factor a value so every gradient flows
        if p.requires_grad:
            p.data.normal_(0, 0.05)
    trl_private.install()
    args = grpo.grpo_args(cfg, root / "out", 16, [1.0], cuda=False)
    ds = Dataset.from_list([{"prompt": "p"}] * 8)
    with lora.allow_out_proj(), lora.trainer_accepts_head_lora(pm):
        trainer = GRPOTrainer(model=pm, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                              args=args, train_dataset=ds, processing_class=tok)
    lora.install_fused_lora_head(pm, temperature=float(trainer.temperature), outputs=("log_probs", "entropy"))
    packed_rows.install(pm, attention="varlen")
    g = torch.Generator().manual_seed(1)
    B, P, C, V = 8, 11, 16, int(pm.config.vocab_size)
    plen = [11, 7, 9, 4, 11, 6, 10, 8]
    clen = [16, 3, 12, 0, 9, 16, 1, 5]  # a 0: truncated and masked (TRL zeroes its whole completion mask)
    prompt_ids = torch.randint(3, V, (B, P), generator=g)
    prompt_mask = torch.zeros(B, P, dtype=torch.long)
    for b, n in enumerate(plen):
        prompt_mask[b, P - n:] = 1  # TRL pads prompts on the left
    completion_ids = torch.randint(3, V, (B, C), generator=g)
    completion_mask = torch.zeros(B, C, dtype=torch.long)
    for b, n in enumerate(clen):
        completion_mask[b, :n] = 1
    tokens = completion_mask.sum()
    inputs = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
              "completion_mask": completion_mask, "advantages": torch.randn(B, generator=g),
              "num_items_in_batch": tokens * 2}  # the generation batch spans two micro-steps' tokens
    # old log-probs far enough from the policy's that both clip sides engage
    with torch.no_grad():
        ids = torch.cat([prompt_ids, completion_ids], 1)
        lp, _, _ = trainer._get_per_token_logps_and_entropies(pm, ids, torch.cat([prompt_mask, completion_mask], 1), C)
    inputs["old_per_token_logps"] = (lp + 0.3 * torch.randn(lp.shape, generator=g)) * completion_mask
    inputs["ref_per_token_logps"] = (lp + 0.1 * torch.randn(lp.shape, generator=g)) * completion_mask
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 2  # set by the training loop; 2: every normaliser uses it
    return trainer, pm, inputs


def _cast(inputs: dict, dtype) -> dict:
    return {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in inputs.items()}


def _grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def _zero(model):
    for p in model.parameters():
        p.grad = None


def trl_loss(trainer, model, inputs):
    """TRL's own unpacked loss (GRPOTrainer._compute_loss) and its LoRA gradients."""
    _zero(model)
    loss = type(trainer)._compute_loss(trainer, model, inputs)
    loss.backward()
    return float(loss.detach()), _grads(model)


def packed_loss(trainer, model, inputs, boundaries=True):
    _zero(model)
    s = trl_private.packed_settings(trainer, pack_tokens=40)  # several packs of a few rows each
    loss, _ = grpo_packed.micro_batch_loss(model, inputs, s, backward=lambda part: part.backward(),
                                           boundaries=boundaries)
    loss.backward()
    return float(loss.detach()), _grads(model)


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b) and a
    return max(float((a[n].double() - b[n].double()).abs().max()) for n in a)


@pytest.mark.parametrize("loss_type, beta", [("dapo", 0.0), *((t, 0.04) for t in LOSS_TYPES)])
def test_packed_loss_and_lora_gradients_equal_trls_unpacked(setup, loss_type, beta):
    trainer, pm, inputs = setup
    trainer.loss_type, trainer.beta = loss_type, beta
    try:
        assert len(grpo_packed.packs(grpo_packed.rows(inputs["prompt_ids"], inputs["prompt_mask"],
                                                      inputs["completion_ids"], inputs["completion_mask"]), 40)) > 2
        m64 = copy.deepcopy(pm).double()
        m64.base_model.model.set_experts_implementation("eager")  # torch's grouped_mm has no fp64 kernel
        ref_l, ref_g = trl_loss(trainer, m64, _cast(inputs, torch.float64))
        trl_l, trl_g = trl_loss(trainer, pm, inputs)
        pk_l, pk_g = packed_loss(trainer, pm, inputs)
        neg_l, neg_g = packed_loss(trainer, pm, inputs, boundaries=False)
    finally:
        trainer.loss_type, trainer.beta = "dapo", 0.0
    mag = max(float(g.abs().max()) for g in ref_g.values())
    trl_err, pk_err, neg_err = _max_diff(trl_g, ref_g), _max_diff(pk_g, ref_g), _max_diff(neg_g, ref_g)
    bound = 4 * trl_err + 8 * EPS32 * mag
    # the loss: what fp32 rounding of the largest log-prob moves, times the largest advantage
    l_mag = float(inputs["old_per_token_logps"].abs().max() * inputs["advantages"].abs().max())
    l_bound = 4 * abs(trl_l - ref_l) + 2 * EPS32 * l_mag
    print(f"\n| {loss_type} | {beta} | {ref_l:.6f} | {abs(pk_l - ref_l):.2e} | {abs(trl_l - ref_l):.2e} | "
          f"{l_bound:.2e} | {abs(neg_l - ref_l):.2e} | {pk_err:.2e} | {trl_err:.2e} | {bound:.2e} | {neg_err:.2e} | "
          f"{neg_err / bound:,.0f}x |")
    assert abs(pk_l - ref_l) <= l_bound
    assert pk_err <= bound
    assert neg_err >= 1000 * bound


def test_bfd_keeps_rows_whole_and_refuses_one_too_long():
    bins = grpo_packed.bfd([5, 9, 3, 7, 1], 10)
    assert sorted(i for b in bins for i in b) == [0, 1, 2, 3, 4]
    assert all(sum([5, 9, 3, 7, 1][i] for i in b) <= 10 for b in bins) and len(bins) == 3
    with pytest.raises(Exception, match="does not fit one pack"):
        grpo_packed.bfd([11], 10)


def test_a_mask_that_is_not_a_prefix_is_refused():
    ids = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(Exception, match="not a prefix"):
        grpo_packed.rows(ids, ids, ids, torch.tensor([[1, 0, 1, 0]]))


def test_the_packed_old_logprobs_equal_trls(setup):
    """The no-grad pass TRL runs for old (and reference) log-probs, packed: equal to TRL's per row, to fp32 rounding
    (both fp32: |d| within 8 eps x the largest |log-prob|), zero where the completion is masked."""
    trainer, pm, inputs = setup
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    C = inputs["completion_ids"].shape[1]
    with torch.no_grad():
        want, went, _ = type(trainer)._get_per_token_logps_and_entropies(trainer, pm, ids, mask, C,
                                                                         compute_entropy=True)
        got, gent = grpo_packed.per_token_logps(pm, ids, mask, C, 40, compute_entropy=True)
    cm = inputs["completion_mask"].bool()
    assert float((got - want)[cm].abs().max()) <= 64 * EPS32 * float(want.abs().max())
    assert float((gent - went)[cm].abs().max()) <= 64 * EPS32 * float(went.abs().max())
    assert float(got[~cm].abs().max()) == 0.0


def test_a_packed_training_step_gives_trls_gradient(setup, monkeypatch):
    """Through transformers' own `Trainer.training_step` (its loss scaling before backward included; GRPOTrainer
    sets `compute_loss_func`, so it scales nothing): the trainer with `install_packing` gives TRL's unpacked step's
    LoRA gradient, within 4x the unpacked step's fp32 error against fp64 + 8 eps x the largest gradient. Every pack
    but the last goes backward inside compute_loss: scaled by half (the negative control) it misses by >= 1,000x."""
    trainer, pm, inputs = setup
    monkeypatch.setattr(trainer, "_prepare_inputs", lambda batch: dict(inputs))
    _zero(pm)
    trainer.training_step(pm, {}, None)
    want = _grads(pm)
    m64 = copy.deepcopy(pm).double()
    m64.base_model.model.set_experts_implementation("eager")
    _, ref = trl_loss(trainer, m64, _cast(inputs, torch.float64))
    for name in ("compute_loss", "_get_per_token_logps_and_entropies", "_generate_and_score_completions"):
        monkeypatch.setattr(trainer, name, getattr(trainer, name))  # restored after the test
    monkeypatch.setattr(trainer, "_lab_gap_watched", False, raising=False)
    trl_private.install_packing(trainer, pack_tokens=40)
    assert trl_private.backward_scale(trainer, None) == 1.0
    _zero(pm)
    trainer.training_step(pm, {}, None)
    got = _grads(pm)
    mag = max(float(g.abs().max()) for g in ref.values())
    bound = 4 * _max_diff(want, ref) + 8 * EPS32 * mag
    monkeypatch.setattr(trl_private, "backward_scale", lambda t, n: 0.5)
    _zero(pm)
    trainer.training_step(pm, {}, None)
    wrong = _grads(pm)
    print(f"\ntraining_step: TRL fp32 {_max_diff(want, ref):.2e}, packed {_max_diff(got, ref):.2e}, bound {bound:.2e}, "
          f"early packs scaled by half {_max_diff(wrong, ref):.2e}")
    assert _max_diff(got, ref) <= bound
    assert _max_diff(wrong, ref) >= 1000 * bound
    assert trainer._metrics["train"]["entropy"] and trainer._metrics["train"]["clip_ratio/region_mean"]
