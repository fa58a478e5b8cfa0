"""The routed experts' LoRA on routed tokens only (lab.model.experts_lora) against PEFT 0.21.2's fold, on the tiny
Nemotron-H (conf/model/tiny.yaml's architecture), fp32, attached by the lab's own path (lab.model.lora.attach_lora).

alpha = 2r (scaling 2; the recipe's is 1) so that a path that forgets the scaling is caught; lora_B is randomised (PEFT
starts it at zero, where every LoRA term vanishes and any layout would pass). Exact means tests/exactness.py's rule: the
routed fp32 path and the fold in fp32 both against the fold in fp64, negative controls 1,000x beyond the bound."""

from __future__ import annotations

import copy
import functools
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

import exactness as ex  # noqa: E402

from lab import LabError  # noqa: E402
from lab.core import config  # noqa: E402
from lab.model import experts_lora as el  # noqa: E402
from lab.model import lora  # noqa: E402

EXPERTS_ONLY = "sft.lora.targets=[experts]"
ALL_FAMILIES = ("sft.lora.targets=[q_proj,k_proj,v_proj,o_proj,in_proj,out_proj,shared_experts.up_proj,"
                "shared_experts.down_proj,experts]")  # conf/sft/default.yaml's


def compose(*extra):
    return config.compose(["sft.lora.alpha=64", *extra])


def build(*extra, seed=0):
    """(cfg, peft model) of the tiny architecture in fp32 with the configured LoRA attached and lora_B randomised."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    cfg = compose(*extra)
    torch.manual_seed(seed)
    arch = config.OmegaConf.to_container(cfg.model.architecture, resolve=True)
    model = NemotronHForCausalLM(NemotronHConfig(**arch)).float()
    pm, _ = lora.attach_lora(cfg, model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return cfg, pm


@functools.cache
def build64(*extra, seed=0):
    """build()'s model, the same weights, on PEFT's fold in fp64 with transformers' "eager" experts (torch's
    grouped_mm has no fp64 kernel): the reference (built once per configuration; never switched to routed)."""
    extra = [e for e in extra if not e.startswith("sft.lora.experts_path=")]
    cfg, pm = build(*extra, "sft.lora.experts_path=fold", seed=seed)
    pm.double()
    pm.base_model.model.set_experts_implementation("eager")
    return cfg, pm


def lora_params(pm):
    return {n: p for n, p in pm.named_parameters() if "lora_" in n}


def moe(pm, i=2):
    return pm.base_model.model.model.layers[i].mixer


def experts_case(pm, tokens=96, seed=2):
    """One MoE layer's experts module, inputs routed by its real router (every expert gets tokens), a grad_out."""
    m = moe(pm)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, m.experts.get_base_layer().up_proj.shape[-1], generator=g)
    with torch.no_grad():
        _, w, idx = m.gate(x)
    assert len(idx.unique()) == m.experts.get_base_layer().num_experts
    return m.experts, x, idx, w, torch.randn(x.shape, generator=g)


def run_experts(experts, x, idx, w, grad_out, params):
    for p in params.values():
        p.grad = None
    x = x.clone().requires_grad_()
    y = experts(x, idx, w)
    (y * grad_out).sum().backward()
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in params.items() if p.grad is not None}


def case64(pm64, case):
    """`case` (experts_case) for the fp64 model: its experts module, the same tokens and routing, in fp64."""
    _, x, idx, w, grad_out = case
    return moe(pm64).experts, x.double(), idx, w.double(), grad_out.double()


def check(name, routed, fold, fold64, negative=None):
    """tests/exactness.py's rule on (output, input grad, LoRA grads): the routed path against the fp64 fold, beside
    the fp32 fold's own error; `negative` (the same triple from a wrong path) 1,000x beyond."""
    neg = [None] * 3 if negative is None else negative
    ex.check_abs(f"{name}: output", routed[0], fold[0], fold64[0], neg[0])
    ex.check_abs(f"{name}: input grad", routed[1], fold[1], fold64[1], neg[1])
    ex.check_rel(f"{name}: LoRA grads", routed[2], fold[2], fold64[2], neg[2])


# ---- the attach path ---------------------------------------------------------------------------------------------

def test_attach_switches_every_moe_layer_to_the_configured_path():
    cfg, pm = build()  # the default: every family, experts_path routed
    n_moe = list(cfg.model.architecture.layers_block_type).count("moe")
    assert n_moe == 2 and el.path_of(pm) == "routed" and len(el.expert_wrappers(pm)) == n_moe
    assert all("forward" in w.__dict__ for w in el.expert_wrappers(pm))
    _, pm = build("sft.lora.experts_path=fold")
    assert el.path_of(pm) == "fold" and not any("forward" in w.__dict__ for w in el.expert_wrappers(pm))
    _, pm = build("sft.lora.targets=[q_proj]")
    assert el.path_of(pm) == "none" and lora.switch_experts_lora(cfg, pm) == "none"


def test_attach_refuses_when_a_moe_layer_was_not_switched(monkeypatch):
    """Negative control of the count check: an enable that misses one layer is an error, not a silent fold."""
    real = el.enable

    def one_short(model):
        real(model)
        del el.expert_wrappers(model)[0].__dict__["forward"]
        return len(el.expert_wrappers(model)) - 1

    monkeypatch.setattr(el, "enable", one_short)
    with pytest.raises(LabError, match="1 of 2"):
        build()


def test_schema_refuses_an_unknown_path():
    with pytest.raises(LabError, match="experts_path"):
        compose("sft.lora.experts_path=merged")


# ---- routed == fold ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("impl", ["grouped_mm", "eager"])
def test_experts_module_matches_fold(impl):
    _, pm = build(EXPERTS_ONLY, "sft.lora.experts_path=fold")
    pm.base_model.model.set_experts_implementation(impl)
    params = lora_params(pm)
    case = experts_case(pm)
    fold = run_experts(*case, params)
    assert len(fold[2]) == 4 and all(v.abs().max() > 0 for v in fold[2].values())  # A, B of up_proj and down_proj
    assert el.enable(pm) == 2
    routed = run_experts(*case, params)
    _, pm64 = build64(EXPERTS_ONLY)
    check(f"routed experts ({impl}), one layer", routed, fold, run_experts(*case64(pm64, case), lora_params(pm64)))
    base = case[0].get_base_layer()  # the frozen stacks get no gradient
    assert base.up_proj.grad is None and base.down_proj.grad is None and not base.up_proj.requires_grad


@pytest.mark.parametrize("targets", [EXPERTS_ONLY, ALL_FAMILIES])
def test_full_model_matches_fold(targets):
    """The whole tiny model: logits, input-embedding grads and every LoRA grad, routed (fp32) against the fold in
    fp64, beside the fp32 fold's own error (with every family the MoE layers' rounding reaches the earlier layers'
    gradients, about 1.2e-6 in fp32 on either path)."""
    _, pm = build(targets, "sft.lora.experts_path=fold")
    ids = torch.randint(0, 768, (2, 40), generator=torch.Generator().manual_seed(3))
    grad_logits = torch.randn(2, 40, 768, generator=torch.Generator().manual_seed(4)) / 100

    def run(pm):
        params = lora_params(pm)
        pm.zero_grad(set_to_none=True)
        emb = pm.get_input_embeddings()(ids).detach().requires_grad_()
        out = pm(inputs_embeds=emb).logits
        (out * grad_logits.to(out.dtype)).sum().backward()
        frozen = [n for n, p in pm.named_parameters() if "lora_" not in n and p.grad is not None]
        assert not frozen, frozen
        return out.detach(), emb.grad, {n: p.grad.clone() for n, p in params.items()}

    fold = run(pm)
    el.enable(pm)
    routed = run(pm)
    check(f"routed experts, whole model ({targets.split('=')[1]})", routed, fold, run(build64(targets)[1]))
    assert sum(".experts." in n and "shared" not in n for n in routed[2]) == 8  # 2 layers x 2 stacks x (A, B)
    assert all(g.abs().max() > 0 for g in routed[2].values())


def test_zero_lora_is_transformers_bitwise():
    """With B = 0 the routed path is transformers' own grouped_mm_experts_forward, bit for bit."""
    _, pm = build(EXPERTS_ONLY)
    with torch.no_grad():
        for n, p in lora_params(pm).items():
            if "lora_B" in n:
                p.zero_()
    experts, x, idx, w, _ = experts_case(pm)
    assert torch.equal(experts(x, idx, w), experts.get_base_layer()(x, idx, w))


def test_small_rank_uses_the_fallback_op():
    """rank 2 in fp32 is 8 bytes: torch's grouped_mm refuses the stride; transformers' per-expert op gives the same."""
    _, pm = build(EXPERTS_ONLY, "sft.lora.r=2", "sft.lora.alpha=4", "sft.lora.experts_path=fold")
    params = lora_params(pm)
    case = experts_case(pm)
    fold = run_experts(*case, params)
    el.enable(pm)
    _, pm64 = build64(EXPERTS_ONLY, "sft.lora.r=2", "sft.lora.alpha=4")
    check("routed experts, rank 2 (fallback op)", run_experts(*case, params), fold,
          run_experts(*case64(pm64, case), lora_params(pm64)))


def test_experts_rank_pattern():
    """gpu.experts_rank (PEFT rank_pattern/alpha_pattern on the experts only, lab.model.lora.expert_patterns): the
    routed path reads each wrapper's own rank and scaling."""
    _, pm = build("sft.lora.targets=[experts,q_proj]", "gpu.experts_rank=8", "sft.lora.experts_path=fold")
    params = lora_params(pm)
    assert moe(pm).experts.lora_A["default"].weight.shape[0] == 4 * 8  # E x experts_rank
    case = experts_case(pm)
    fold = run_experts(*case, params)
    el.enable(pm)
    _, pm64 = build64("sft.lora.targets=[experts,q_proj]", "gpu.experts_rank=8")
    check("routed experts, experts_rank 8", run_experts(*case, params), fold,
          run_experts(*case64(pm64, case), lora_params(pm64)))


def test_gradient_checkpointing():
    """Training mode, non-reentrant checkpointing (as TRL and lab.plan.memory run it): the same grads as the fold."""
    ids = torch.randint(0, 768, (2, 32), generator=torch.Generator().manual_seed(5))

    def run(pm):
        pm.train()
        pm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        pm.zero_grad(set_to_none=True)
        pm(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in lora_params(pm).items()}

    _, pm = build(EXPERTS_ONLY, "sft.lora.experts_path=fold")
    fold = run(pm)
    el.enable(pm)
    routed = run(pm)
    ex.check_rel("routed experts, checkpointed: LoRA grads", routed, fold, run(build64.__wrapped__(EXPERTS_ONLY)[1]))


# ---- negative controls: a wrong layout must fail the same comparison ---------------------------------------------

RIGHT = el.expert_factors


def wrong_b_order(w, adapter):
    """lora_B read expert-major (column e*r + j) instead of PEFT's expert-fastest (column j*E + e)."""
    A, _, s = RIGHT(w, adapter)
    b = w.lora_B[adapter].weight
    return A, b.reshape(b.shape[0], w.num_experts, -1).permute(1, 0, 2).contiguous(), s


def wrong_a_order(w, adapter):
    """lora_A read expert-fastest (row j*E + e) instead of expert-major."""
    _, B, s = RIGHT(w, adapter)
    a = w.lora_A[adapter].weight
    return a.reshape(-1, w.num_experts, a.shape[-1]).transpose(0, 1).contiguous(), B, s


def no_scaling(w, adapter):
    A, B, _ = RIGHT(w, adapter)
    return A, B, 1.0


@pytest.mark.parametrize("wrong", [wrong_b_order, wrong_a_order, no_scaling])
def test_a_wrong_layout_fails_the_comparison(monkeypatch, wrong):
    _, pm = build(EXPERTS_ONLY, "sft.lora.experts_path=fold")
    params = lora_params(pm)
    case = experts_case(pm)
    fold = run_experts(*case, params)
    el.enable(pm)
    routed = run_experts(*case, params)
    monkeypatch.setattr(el, "expert_factors", wrong)
    _, pm64 = build64(EXPERTS_ONLY)
    check(f"routed experts, negative control {wrong.__name__}", routed, fold,
          run_experts(*case64(pm64, case), lora_params(pm64)), negative=run_experts(*case, params))


# ---- adapter states, saving, the gradient check ------------------------------------------------------------------

def test_disable_adapter_is_the_base_and_disable_gives_the_fold_back():
    _, pm = build(EXPERTS_ONLY, "sft.lora.experts_path=fold")
    experts, x, idx, w, _ = experts_case(pm)
    with torch.no_grad():
        plain = experts.get_base_layer()(x, idx, w)
        fold = experts(x, idx, w)
        el.enable(pm)
        with pm.disable_adapter():
            assert torch.equal(experts(x, idx, w), plain)
        routed = experts(x, idx, w)
        _, pm64 = build64(EXPERTS_ONLY)
        fold64 = moe(pm64).experts(x.double(), idx, w.double())
        ex.check_abs("routed experts vs fold, the adapter off as negative control", routed, fold, fold64,
                     negative=plain)
        assert el.disable(pm) == 2 and el.path_of(pm) == "fold"
        assert torch.equal(experts(x, idx, w), fold)


def test_saved_adapter_is_the_same_file(tmp_path):
    """Same parameters, keys, shapes and adapter file bytes on either path (so pack, check and vLLM are unchanged)."""
    from safetensors.torch import load_file

    _, pm = build("sft.lora.experts_path=fold")
    fold_sd = {k: v.shape for k, v in pm.state_dict().items()}
    pm.save_pretrained(tmp_path / "fold")
    el.enable(pm)
    assert {k: v.shape for k, v in pm.state_dict().items()} == fold_sd
    pm.save_pretrained(tmp_path / "routed")
    a, b = (tmp_path / p / "adapter_model.safetensors" for p in ("fold", "routed"))
    assert a.read_bytes() == b.read_bytes()
    assert any(k.endswith("experts.base_layer.lora_B.weight") for k in load_file(a))


def test_unsupported_implementation_refused():
    _, pm = build(EXPERTS_ONLY)
    pm.base_model.model.set_experts_implementation("batched_mm")
    experts, x, idx, w, _ = experts_case(pm)
    with pytest.raises(LabError, match="batched_mm"):
        experts(x, idx, w)


def test_deepcopy_keeps_routing():
    _, pm = build(EXPERTS_ONLY)
    pm2 = copy.deepcopy(pm)
    e2 = moe(pm2).experts
    assert e2.forward.__self__ is e2 and el.path_of(pm2) == "routed"


def test_gradient_check_proves_every_family_trained_on_the_routed_path():
    """lab.model.lora.GradientCheck after three AdamW steps on the routed path: every family (experts included) had
    a gradient and moved, no frozen tensor moved."""
    _, pm = build()
    pm.train()
    check = lora.GradientCheck(pm)
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=1e-3)
    ids = torch.randint(0, 768, (2, 32), generator=torch.Generator().manual_seed(6))
    for _ in range(3):
        opt.zero_grad()
        pm(input_ids=ids, labels=ids).loss.backward()
        check.record_grads()
        opt.step()
    rep = check.report()
    assert "experts" in set(rep["family"]) and rep["ok"].all(), rep
    assert check.frozen_report()["unchanged"].all()


def test_memory_trace_names_the_path():
    """lab.plan.memory traces whichever path attach_lora took: the fold's baddbmm stacks on the fold, none on the
    routed path, whose peak is not higher (the tiny model in bf16, fake tensors; its peak is in a Mamba backward, so
    equal here: the real model's peaks are `python -m lab memory`'s, in the report of issue 42)."""
    from lab.plan import memory

    traces = {p: memory.trace(config.compose(["model.dtype=bfloat16", f"sft.lora.experts_path={p}"]), "sft",
                              tokens=128, rows=2, mamba="torch", head="torch")
              for p in ("routed", "fold")}
    assert "baddbmm" in traces["fold"].experts_path and "routed tokens" not in traces["fold"].experts_path
    assert "routed tokens" in traces["routed"].experts_path and "baddbmm" not in traces["routed"].experts_path
    assert traces["routed"].peak_bytes <= traces["fold"].peak_bytes
