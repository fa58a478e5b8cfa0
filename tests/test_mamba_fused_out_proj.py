"""The fused Mamba kernel with the out_proj LoRA after it (lab.model.lora `_FusedScanGuard`, issue 42), on the CPU.

mamba_ssm's kernel does not run here, so a stand-in takes its place: `mamba_split_conv1d_scan_combined` computed by the
mixer's own PyTorch path from the projected states (in_proj's output), with out_proj applied only when the caller
passes `outproj_weight` (as the kernel does: mamba_ssm/ops/triton/ssd_combined.py, MambaSplitConv1dScanCombinedFn),
behind transformers' hub wrapper and bound to mamba-ssm 2.3.2.post1's signature (tests/real_signatures.py).
What this proves: the guard calls the kernel without out_proj and puts the mixer's out_proj module (with its LoRA)
after it, so the model's outputs and every LoRA gradient equal the PyTorch path's. What it cannot prove: the CUDA
kernel itself (not run on a GPU)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

import exactness as ex  # noqa: E402
import real_signatures as rs  # noqa: E402

from lab.core import config  # noqa: E402
from lab.model import lora  # noqa: E402


class _Const(torch.nn.Module):
    def __init__(self, t):
        super().__init__()
        self.t = t

    def forward(self, h):
        return self.t


class _NoProj(torch.nn.Identity):
    """out_proj taken out: the mixer's forward reads `out_proj.weight` / `.bias` for the kernel call."""
    weight = None
    bias = None


def make_stand_in(calls):
    """The fused kernel as a function of the running mixer's PyTorch path (module docstring)."""
    busy = []

    def kernel(zxbcdt, *args, outproj_weight=None, outproj_bias=None, **kwargs):
        if busy:  # the mixer's own forward, inside the stand-in, asks for the kernel again: take the PyTorch path
            return None
        mixer = lora._RUNNING.get()
        calls.append(outproj_weight)
        busy.append(1)
        token = lora._RUNNING.set(None)
        in_proj, out_proj = mixer.in_proj, mixer.out_proj
        try:
            mixer.in_proj, mixer.out_proj = _Const(zxbcdt), _NoProj()
            y = type(mixer).forward(mixer, zxbcdt)  # gated, normed scan output (no out_proj)
        finally:
            mixer.in_proj, mixer.out_proj = in_proj, out_proj
            lora._RUNNING.reset(token)
            busy.clear()
        return y if outproj_weight is None else torch.nn.functional.linear(y, outproj_weight, outproj_bias)
    return kernel


def build(fp64=False):
    """The tiny model with in_proj and out_proj LoRAs (lora_B drawn); `fp64`: the same weights in fp64 (transformers'
    "eager" experts: torch's grouped_mm has no fp64 kernel), the reference tests/exactness.py measures against."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    cfg = config.compose(["sft.lora.targets=[in_proj,out_proj]"])
    torch.manual_seed(0)
    arch = config.OmegaConf.to_container(cfg.model.architecture, resolve=True)
    pm, _ = lora.attach_lora(cfg, NemotronHForCausalLM(NemotronHConfig(**arch)).float())
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    if fp64:
        pm.double()
        pm.base_model.model.set_experts_implementation("eager")
    pm.train()
    return pm


def step(pm, ids):
    pm.zero_grad(set_to_none=True)
    out = pm(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    return out.logits.detach(), {n: None if p.grad is None else p.grad.clone()
                                 for n, p in pm.named_parameters() if "lora_" in n}


def test_fused_kernel_then_out_proj_lora_equals_the_pytorch_path(monkeypatch):
    import transformers.models.nemotron_h.modeling_nemotron_h as mh

    pm = build()
    ids = torch.randint(5, 700, (2, 24), generator=torch.Generator().manual_seed(1))
    ref = step(pm, ids)  # no kernel on the CPU: the guard's inner returns None, the PyTorch path runs
    ref64 = step(build(fp64=True), ids)
    calls = []
    guard = mh.__dict__[lora.FUSED_FN]
    monkeypatch.setattr(guard, "inner", rs.hub_kernel(monkeypatch, "mamba_split_conv1d_scan_combined", guard.inner,
                                                      make_stand_in(calls)))
    fused = step(pm, ids)
    n_mamba = sum(type(m).__name__.endswith("Mamba2Mixer") for m in pm.modules())
    assert len(calls) == n_mamba and all(c is None for c in calls)  # the kernel ran, without out_proj
    assert ref[1].keys() == fused[1].keys() and any(".out_proj." in n for n in ref[1])
    for n in ref[1]:
        assert fused[1][n] is not None and fused[1][n].abs().max() > 0, n
    ex.check_abs("mamba fused kernel + out_proj LoRA (stand-in): logits", fused[0], ref[0], ref64[0])
    ex.check_rel("mamba fused kernel + out_proj LoRA (stand-in): LoRA grads", fused[1], ref[1], ref64[1])


def test_negative_control_kernel_with_out_proj_loses_the_lora(monkeypatch):
    """Without the guard's rewrite (the kernel multiplies by out_proj.weight itself, the pre-lab behaviour), the
    out_proj LoRA gets no gradient: 1,000x beyond the bound the test above meets (tests/exactness.py)."""
    import transformers.models.nemotron_h.modeling_nemotron_h as mh

    pm = build()
    ids = torch.randint(5, 700, (2, 24), generator=torch.Generator().manual_seed(1))
    ref, ref64 = step(pm, ids), step(build(fp64=True), ids)
    calls = []
    guard = mh.__dict__[lora.FUSED_FN]
    kernel = rs.hub_kernel(monkeypatch, "mamba_split_conv1d_scan_combined", guard.inner, make_stand_in(calls))

    def unguarded(*args, **kwargs):  # what transformers would call without lab.model.lora
        if not lora._RUNNING.get():
            return guard.inner(*args, **kwargs)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(guard, "inner", kernel)
    monkeypatch.setattr(mh, lora.FUSED_FN, unguarded)
    _, grads = step(pm, ids)
    assert calls and all(c is not None for c in calls)
    out_proj = [n for n in grads if ".out_proj." in n]
    assert out_proj and all(grads[n] is None or grads[n].abs().max() == 0 for n in out_proj)
    lost = {n: torch.zeros_like(ref[1][n]) if grads[n] is None else grads[n] for n in out_proj}
    ex.check_rel("mamba kernel multiplying by out_proj itself: out_proj LoRA grads", *(
        {n: r[1][n] for n in out_proj} for r in (ref, ref, ref64)), negative=lost)
    assert all(grads[n] is not None for n in grads if ".in_proj." in n)  # the rest still trains
