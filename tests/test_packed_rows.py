"""Packed rows are exact (lab/model/packed_rows.py): the tiny Nemotron-H with the lab's LoRA, fp32, CPU.

"Rows one by one" is what the recipe trains without packing: each row alone (batch 1), the step's loss the summed
NLL of every completion token over the number of those tokens (transformers' Trainer `num_items_in_batch` and TRL's
`SFTTrainer.compute_loss`: a token-weighted mean over the optimizer step). Packed: the same rows concatenated in one
sequence with `position_ids` restarting at 0 per row, as TRL's padding-free collator builds it; the row's first
label is never a target in either case. Exact means tests/exactness.py's rule: against the rows one by one in fp64,
the packed fp32 run's per-token log-probs, loss and every LoRA gradient tensor (||g - g64|| / ||g64||) are within a
small multiple of the fp32 rows' own error, and each negative control lies at least 1,000x beyond that bound.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

import exactness as ex  # noqa: E402
import real_signatures as rs  # noqa: E402

from lab import LabError  # noqa: E402
from lab.core import config  # noqa: E402
from lab.model import lora, models, packed_rows  # noqa: E402
from train_steps import sft_train  # noqa: E402

LENGTHS = [37, 90, 13, 70]  # 210 tokens: rows shorter and longer than the tiny model's chunk_size 64
LOSS_TOL, GRAD_TOL = 1e-6, 1e-5  # the SFTTrainer step only (slow lane): packed vs unpacked, both fp32


def compose(root, *extra):
    return config.compose([f"run_dir={root / 'run'}", f"model.path={root / 'base_model'}", *extra])


def build(root, seed=1):
    """The tiny model with the lab's LoRA (conf/sft/default.yaml's families), seeded, lora_B drawn N(0, 0.05) instead
    of PEFT's zeros so that every LoRA tensor, A included, has a gradient."""
    cfg = compose(root)
    model, _ = models.load(cfg)
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)  # PEFT draws lora_A from the global generator: every build starts the same
        pm, _ = lora.attach_lora(cfg, model)
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.05)
    pm.train()
    return pm


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("packed")


@pytest.fixture(scope="module")
def pm(root):
    return build(root)


@pytest.fixture(scope="module")
def pm64(root):
    """The same model (same seed) in fp64: the reference every fp32 path is measured against (transformers' "eager"
    experts: torch's grouped_mm has no fp64 kernel)."""
    model = build(root).double()
    model.base_model.model.set_experts_implementation("eager")
    return model


def make_rows(lengths, seed=0, prompt_frac=0.4):
    """SFT-like rows: (input_ids, labels) with the prompt's labels at -100."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        ids = torch.randint(5, 300, (n,), generator=g)
        labels = ids.clone()
        labels[:max(1, int(n * prompt_frac))] = -100
        rows.append((ids, labels))
    return rows


def n_items(rows):
    return sum(int((lab[1:] != -100).sum()) for _, lab in rows)


def token_logp(logits, ids):
    return torch.log_softmax(logits[0, :-1].float(), -1).gather(-1, ids[1:, None])[:, 0]


def nll(logp, labels, n):
    return -(logp * (labels[1:] != -100)).sum() / n


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def run_rows(model, rows):
    """Each row alone, gradients accumulated: per-row log-probs, the step's loss, the LoRA gradients."""
    model.zero_grad(set_to_none=True)
    n, loss, logps = n_items(rows), 0.0, []
    for ids, labels in rows:
        logp = token_logp(model(input_ids=ids[None], use_cache=False).logits, ids)
        step = nll(logp, labels, n)
        step.backward()
        loss += step.item()
        logps.append(logp.detach())
    return logps, loss, grads(model)


def run_packed(model, rows, position_ids=True):
    """The rows in one sequence, position_ids restarting per row (TRL's padding-free collator)."""
    model.zero_grad(set_to_none=True)
    ids = torch.cat([r[0] for r in rows])
    pos = torch.cat([torch.arange(len(r[0])) for r in rows])
    kw = {"position_ids": pos[None]} if position_ids else {}
    logits = model(input_ids=ids[None], use_cache=False, **kw).logits
    logps, loss, start = [], 0.0, 0
    for r_ids, labels in rows:
        k = len(r_ids)
        logps.append(token_logp(logits[:, start:start + k], r_ids))
        start += k
    loss = sum(nll(lp, lab, n_items(rows)) for lp, (_, lab) in zip(logps, rows))
    loss.backward()
    return [lp.detach() for lp in logps], loss.item(), grads(model)


def check_exact(name, got, ref32, ref64, negative=None):
    """tests/exactness.py's rule on a run's (per-row log-probs, loss, LoRA gradients): `got` (the packed fp32 run)
    against the fp64 rows one by one, next to `ref32` (the fp32 rows one by one); `negative`: a run that must fail."""
    neg = [None] * 3 if negative is None else negative
    ex.check_abs(f"{name}: log-probs", got[0], ref32[0], ref64[0], neg[0])
    ex.check_abs(f"{name}: loss", got[1], ref32[1], ref64[1], neg[1])
    ex.check_rel(f"{name}: LoRA grads", got[2], ref32[2], ref64[2], neg[2])


def installed(model, fn, **kw):
    h = packed_rows.install(model, **kw)
    try:
        return fn()
    finally:
        h.remove()


def test_seq_idx_follows_transformers_packed_rule():
    from transformers.masking_utils import find_packed_sequence_indices

    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 0, 1, 2, 0, 1]])
    seq_idx = packed_rows.seq_idx_from_position_ids(pos)
    assert seq_idx.dtype == torch.int32 and seq_idx.is_contiguous()  # what causal_conv1d's C++ requires
    assert torch.equal(seq_idx.long(), find_packed_sequence_indices(pos))
    assert packed_rows.segments(seq_idx[0]) == [(0, 3), (3, 5), (5, 6), (6, 10)]


def test_packed_equals_rows_one_by_one(pm, pm64):
    rows = make_rows(LENGTHS)
    ref = run_rows(pm, rows)
    assert all(g.norm() > 0 for g in ref[2].values())  # every LoRA tensor has a gradient to compare
    check_exact("packed rows (mask attention)", installed(pm, lambda: run_packed(pm, rows)), ref, run_rows(pm64, rows))


def test_negative_control_without_row_boundaries(pm, pm64):
    """The same packed sequence without the mechanism (position_ids restart: transformers' attention is block-diagonal,
    but the Mamba conv and scan state flows into the next row), and without position_ids at all: both must fail by
    1,000x the bound the mechanism meets."""
    rows = make_rows(LENGTHS)
    ref, ref64 = run_rows(pm, rows), run_rows(pm64, rows)
    got = installed(pm, lambda: run_packed(pm, rows))
    for with_pos in (True, False):
        bad = run_packed(pm, rows, position_ids=with_pos)
        check_exact(f"packed rows, no boundaries (position_ids={with_pos})", got, ref, ref64, negative=bad)
        # the first row has nothing before it: only the rows after it are wrong
        ex.check_abs("packed rows, no boundaries: the first row", bad[0][0], ref[0][0], ref64[0][0])


def test_gradient_checkpointing_recomputes_with_the_boundaries(root, pm64):
    """Checkpointed blocks are recomputed in backward, after model.forward returned: seq_idx travels in the
    checkpointed keyword arguments (transformers' GradientCheckpointingLayer), so the recomputation splits too."""
    model = build(root)
    model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.base_model.model.enable_input_require_grads()
    rows = make_rows([40, 60, 25, 75], seed=2)
    ref = run_rows(model, rows)
    check_exact("packed rows, checkpointed", installed(model, lambda: run_packed(model, rows)), ref,
                run_rows(pm64, rows))


def test_masks_cache_and_remove(pm):
    """An all-ones attention_mask is dropped (it would switch transformers' block-diagonal mask off); a mask with
    padding, or one row per batch row, is left alone; install twice hooks once; remove restores the model."""
    rows = make_rows(LENGTHS)
    ids = torch.cat([r[0] for r in rows])[None]
    pos = torch.cat([torch.arange(len(r[0])) for r in rows])[None]
    seen = []
    mixer = next(m for m in pm.modules() if type(m).__name__ == packed_rows.MIXER_CLASS)
    spy = mixer.register_forward_pre_hook(lambda m, a, kw: seen.append(kw.get("seq_idx")), with_kwargs=True)
    h1, h2 = packed_rows.install(pm), packed_rows.install(pm)
    assert len(h1.hooks) == 2 and h2.hooks == [] and h2.mixers == []  # the backbone's pre- and post-hook
    try:
        with torch.no_grad():
            ones = pm(input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids)).logits
            none = pm(input_ids=ids, position_ids=pos).logits
            padded = torch.ones_like(ids)
            padded[0, :3] = 0
            pm(input_ids=ids, position_ids=pos, attention_mask=padded)
            pm(input_ids=ids)  # one row: nothing packed
    finally:
        h1.remove()
        h2.remove()
    spy.remove()
    assert torch.equal(ones, none)
    assert seen[0] is not None and seen[1] is not None and seen[2] is None and seen[3] is None
    assert torch.equal(seen[0], packed_rows.seq_idx_from_position_ids(pos))
    backbone = pm.base_model.model.model
    assert "forward" not in mixer.__dict__ and not backbone._forward_pre_hooks and not backbone._forward_hooks


def _conv_with_seq_idx(hidden_states, weight, bias=None, activation=None, seq_idx=None, **kwargs):
    """Depthwise causal conv whose taps never cross a change of seq_idx: causal-conv1d 1.7.0's documented seq_idx
    semantics (its causal_conv1d_ref), in PyTorch."""
    B, _, L = hidden_states.shape
    w = weight.shape[-1]
    seq_idx = torch.zeros(B, L, dtype=torch.int32) if seq_idx is None else seq_idx
    win = torch.nn.functional.pad(hidden_states.to(weight.dtype), (w - 1, 0)).unfold(-1, w, 1)  # (B, C, L, W)
    s = torch.nn.functional.pad(seq_idx, (w - 1, 0), value=-1).unfold(-1, w, 1)  # (B, L, W)
    out = (win * (s == seq_idx[..., None])[:, None] * weight[None, :, None, :]).sum(-1)
    out = out if bias is None else out + bias[None, :, None]
    return torch.nn.functional.silu(out) if activation in ("silu", "swish") else out


def test_kernel_path_hands_seq_idx_to_the_kernels(root, pm64, monkeypatch):
    """The GPU path on CPU: stand-ins that take seq_idx replace the kernel functions the mixer calls (mamba_ssm's and
    causal_conv1d's signatures do), and the kernel path is forced: seq_idx must arrive through transformers' own
    kwargs (int32, contiguous, (batch, seq)), in the recomputation under checkpointing too, and the result be exact."""
    import transformers.models.nemotron_h.modeling_nemotron_h as mnh

    torch_scan, seen = mnh.mamba2_chunk_scan, []

    def scan(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None, dt_softplus=False,
             dt_limit=(0.0, float("inf")), return_final_states=False, seq_idx=None, z=None, **kwargs):
        kw = dict(D=D, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit)
        if seq_idx is None:
            return torch_scan(hidden_states, dt, A, B, C, chunk_size, **kw)
        seen.append((seq_idx.dtype, seq_idx.is_contiguous(), tuple(seq_idx.shape)))
        return torch.cat([torch.cat([torch_scan(hidden_states[b:b + 1, s:e], dt[b:b + 1, s:e], A, B[b:b + 1, s:e],
                                                C[b:b + 1, s:e], chunk_size, **kw)
                                     for s, e in packed_rows.segments(seq_idx[b])], 1)
                          for b in range(hidden_states.shape[0])])

    assert packed_rows.kernel_functions_without_seq_idx(build(root).base_model.model.model.layers[0].mixer) \
        == list(packed_rows.KERNEL_FUNCTIONS)  # this CPU: the PyTorch fallbacks drop seq_idx
    rows = make_rows(LENGTHS, seed=3)
    ref64 = run_rows(pm64, rows)  # before the stand-ins: transformers' own PyTorch path, in fp64
    # each behind transformers' hub wrapper, with the pinned package's signature (tests/real_signatures.py)
    monkeypatch.setattr(mnh, "causal_conv1d_fn",
                        rs.hub_kernel(monkeypatch, "causal_conv1d_fn", mnh.causal_conv1d_fn, _conv_with_seq_idx))
    monkeypatch.setattr(mnh, "mamba2_chunk_scan",
                        rs.hub_kernel(monkeypatch, "mamba_chunk_scan_combined", torch_scan, scan))
    fused = mnh.__dict__["mamba2_split_conv1d_scan_combined"]  # lab.model.lora's guard once a LoRA is attached
    unfused = rs.hub_kernel(monkeypatch, "mamba_split_conv1d_scan_combined", getattr(fused, "inner", fused))
    if isinstance(fused, lora._FusedScanGuard):
        monkeypatch.setattr(fused, "inner", unfused)  # None: no fused result, the mixer runs conv and scan
    else:
        monkeypatch.setattr(mnh, "mamba2_split_conv1d_scan_combined", unfused)
    model = build(root)
    model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mixers = [m for m in model.modules() if type(m).__name__ == packed_rows.MIXER_CLASS]
    assert all(packed_rows.kernel_functions_without_seq_idx(m) == [] for m in mixers)
    ref = run_rows(model, rows)
    seen.clear()
    got = installed(model, lambda: run_packed(model, rows), force_kernel_path=True)
    assert seen == [(torch.int32, True, (1, sum(LENGTHS)))] * (2 * len(mixers))  # forward + recomputation
    check_exact("packed rows, kernel path (stand-ins)", got, ref, ref64)


def test_real_model_packing_refuses_without_kernels(root, monkeypatch):
    """On this machine (no CUDA, no mamba_ssm / causal_conv1d): real-model SFT with packing refuses before loading
    anything, and the check on a loaded model refuses too; the tiny model is not checked."""
    from lab.train import sft

    if torch.cuda.is_available() and not models.missing_mamba_kernels():
        pytest.skip("the kernels are here")
    cfg = config.compose(["model=nemotron_nano", "sft.packing=true"])
    with pytest.raises(LabError, match="fused Mamba kernels|sft.packing=true with the real model"):
        sft.check_packing(cfg)
    with pytest.raises(LabError, match=r"sft.packing=true with the real model .* set sft.packing=false"):
        packed_rows.require_kernels()
    dropped = "mamba2_split_conv1d_scan_combined, causal_conv1d_fn, mamba2_chunk_scan would drop seq_idx"
    with pytest.raises(LabError, match=f"here ({dropped}|there is no CUDA device)"):
        packed_rows.require_kernels(build(root))
    sft.check_packing(compose(root, "sft.packing=true"))  # the tiny model: the CPU path
    sft.check_packing(config.compose(["model=nemotron_nano", "sft.packing=false"]))
    # the preflight's own line: silent here (check_cuda / check_mamba_kernels name what is missing), but where the
    # packages import and a GPU is seen while transformers resolved its fallbacks (seq_idx dropped), it refuses
    from lab.plan import preflight

    preflight.check_packing(cfg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(models, "missing_mamba_kernels", lambda: {})
    with pytest.raises(LabError, match=f"here {dropped}"):
        preflight.check_packing(cfg)
    preflight.check_packing(config.compose(["model=nemotron_nano", "sft.packing=false"]))


def test_packing_config_and_fingerprint(root):
    """sft.packing: false for the demo, true for the real model; TRL gets bfd (rows whole); a checkpoint written
    with other packing is not resumed (it is in the fingerprint); Unsloth is refused before loading."""
    from lab.train import sft

    demo, real = compose(root), config.compose(["experiment=competition"])
    assert demo.sft.packing is False and real.sft.packing is True
    args = sft.training_args(compose(root, "sft.packing=true"), root / "ck")
    assert args.packing and args.packing_strategy == "bfd" and args.max_length == demo.sft.max_seq_len
    assert not sft.training_args(demo, root / "ck").packing
    models.load(demo)  # the fingerprint hashes the built tiny model
    import pandas as pd

    ex = pd.DataFrame({"prompt": ["a"], "completion": ["b"]})
    fp_off, fp_on = sft.fingerprint(demo, ex), sft.fingerprint(compose(root, "sft.packing=true"), ex)
    assert fp_off["sft"]["packing"] is False and fp_on["sft"]["packing"] is True and fp_off != fp_on
    with pytest.raises(LabError, match="sft.packing=true is for sft.backend=hf"):
        sft.check_packing(compose(root, "sft.packing=true", "sft.backend=unsloth"))  # before anything loads


@pytest.mark.slow  # real SFTTrainer runs: tens of seconds on this CPU
def test_sft_with_packing_trains_through_the_lab_and_matches_unpacked(root, monkeypatch):
    """Through the lab's own SFT path: (1) `sft.train` with sft.packing=true on the tiny model trains and its gradient
    check passes; (2) one optimizer step of `sft.build_trainer` (TRL's SFTTrainer, bfd packing, padding-free collator,
    fused LM head) on the same rows gives the unpacked step's LoRA gradients (batch 1, grad_accum = rows)."""
    from transformers import TrainerCallback

    from lab.core.run import Stage
    from lab.puzzles import generate
    from lab.train import sft, trl_private

    puzzles = generate("numeral_system", 6, 0)
    cfg = compose(root, "sft.packing=true", "sft.max_steps=2", "sft.batch_size=1", "sft.grad_accum=1",
                  "sft.save_steps=100", "sft.resume=false", "sft.warmup_ratio=0")  # no step at lr 0
    rows_seen, seq_idx_of = [], packed_rows.seq_idx_from_position_ids

    def spy(position_ids):  # what the backbone hook derives: how many rows each packed micro-step held
        out = seq_idx_of(position_ids)
        rows_seen.append(int(out.max()) + 1)
        return out

    monkeypatch.setattr(packed_rows, "seq_idx_from_position_ids", spy)
    metrics, pm, *_ = sft_train(cfg, Stage("02_sft", cfg=cfg), puzzles)
    monkeypatch.undo()
    assert metrics["steps"] == 2 and metrics["gradient_check_failed"] == []
    assert rows_seen and max(rows_seen) > 1  # packs of several rows reached the model

    trl_private.install()
    cfg0 = compose(root)
    _, tok = models.load(cfg0)
    examples, _ = sft.sft_examples(tok, puzzles, 10_000)
    n, total = len(examples), int(examples["tokens"].sum())
    step = {}

    def one_step(packing):
        over = ["sft.max_steps=1", "sft.batch_size=1", "sft.warmup_ratio=0", "sft.gradient_check=false",
                f"sft.max_seq_len={total}", f"sft.packing={str(packing).lower()}",
                f"sft.grad_accum={1 if packing else n}"]
        c = compose(root, *over)
        model = build(root)
        if packing:
            packed_rows.install(model, attention=str(c.sft.packed_attention))  # varlen, conf/sft/default.yaml
        got, shapes = {}, []

        class Grab(TrainerCallback):
            def on_pre_optimizer_step(self, args, state, control, **kw):
                got.update(grads(model))

        trainer = sft.build_trainer(c, root / f"ck_{packing}", model, tok, examples, [Grab()])
        orig = trainer.compute_loss

        def compute_loss(m, inputs, **kw):
            shapes.append(tuple(inputs["input_ids"].shape))
            return orig(m, inputs, **kw)

        trainer.compute_loss = compute_loss
        trainer.args.max_grad_norm = 0.0  # the raw gradients (clipping would rescale both the same, but be plain)
        step[packing] = (trainer.train().training_loss, got, shapes)

    one_step(False)
    one_step(True)
    assert step[True][2] == [(1, total)] and len(step[False][2]) == n  # one pack vs one row per micro-step
    (l0, g0, _), (l1, g1, _) = step[False], step[True]
    grad = max(((g1[k] - g).norm() / g.norm()).item() for k, g in g0.items() if g.norm() > 0)
    print(f"\nSFTTrainer step, {n} rows: packed loss {l1:.6f} vs unpacked {l0:.6f}, max grad rel {grad:.2e}")
    assert abs(l1 - l0) / l0 < LOSS_TOL and grad < GRAD_TOL, (l0, l1, grad)


# ---- attention over packed rows: sft.packed_attention=varlen (lab.model.packed_rows.ATTENTION) ----------------------

def _sdpa_masks(monkeypatch):
    """Count transformers' sdpa_mask calls that build a tensor (a [T x T] mask)."""
    import transformers.masking_utils as mu

    built, orig = [], mu.sdpa_mask

    def counting(*a, **k):
        m = orig(*a, **k)
        built.append(m is not None)
        return m

    monkeypatch.setattr(mu, "sdpa_mask", counting)  # what lab.model.packed_rows._mask calls
    monkeypatch.setitem(mu.AttentionMaskInterface._global_mapping, "sdpa", counting)  # what create_causal_mask calls
    return built


def test_varlen_attention_packed_equals_rows_one_by_one(pm, pm64, monkeypatch):
    """The packed call runs each row's attention alone (CPU reference path: one causal SDPA per row) and builds no
    [T x T] mask; remove() puts the model's own attention back."""
    built = _sdpa_masks(monkeypatch)
    rows = make_rows(LENGTHS)
    ref = run_rows(pm, rows)
    before = pm.config._attn_implementation
    check_exact("packed rows, varlen attention (CPU path)",
                installed(pm, lambda: run_packed(pm, rows), attention="varlen"), ref, run_rows(pm64, rows))
    assert not any(built)  # the packed call built no mask (the mask path, above, builds one per call)
    assert pm.config._attn_implementation == before != packed_rows.ATTENTION
    installed(pm, lambda: run_packed(pm, rows), attention="mask")
    assert any(built)  # the negative control: transformers' sdpa path builds the block-diagonal mask


def test_varlen_attention_with_checkpointing_and_padding(root, pm64):
    """Recomputed blocks get seq_idx too; a padded batch (not packed) still gets transformers' own mask."""
    model = build(root)
    model.base_model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.base_model.model.enable_input_require_grads()
    rows = make_rows([40, 60, 25, 75], seed=2)
    ref = run_rows(model, rows)
    check_exact("packed rows, varlen attention, checkpointed",
                installed(model, lambda: run_packed(model, rows), attention="varlen"), ref, run_rows(pm64, rows))
    model.eval()
    ids = torch.randint(5, 300, (2, 30), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :12] = 0  # left padding
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        got = installed(model, lambda: model(input_ids=ids, attention_mask=mask, use_cache=False).logits,
                        attention="varlen")
    assert torch.equal(got, want)  # not packed: transformers' own attention, unchanged
    with pytest.raises(LabError, match="packed_attention"):
        packed_rows.install(model, attention="flash")


def _varlen_standin(calls, ignore_rows=False):
    """A CPU stand-in for torch.nn.attention.varlen.varlen_attn with its documented semantics (q, k, v (T, H, D);
    cu_seq (rows + 1,) int32 offsets; window_size (-1, 0) = causal; enable_gqa): one causal SDPA per row.
    `ignore_rows`: the negative control, one causal SDPA over the whole pack."""
    def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False):
        calls.append({"cu": cu_q.tolist(), "max": max_q, "window": tuple(window_size), "gqa": enable_gqa,
                      "dtype": cu_q.dtype, "shape": tuple(q.shape), "same_cu": cu_q is cu_k})
        bounds = [(0, q.shape[0])] if ignore_rows else list(zip(cu_q.tolist()[:-1], cu_q.tolist()[1:]))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        return torch.cat([sdpa(q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1),
                               is_causal=window_size == (-1, 0), scale=scale, enable_gqa=enable_gqa).transpose(0, 1)
                          for s, e in bounds])
    return rs.stand_in("varlen_attn", varlen_attn)  # every call bound to torch's own varlen_attn signature


def test_the_cuda_branch_hands_varlen_attn_each_rows_offsets(pm, pm64, monkeypatch):
    """The branch that runs on CUDA, taken on CPU with a stand-in for varlen_attn: it gets (T, H, D) tensors, the
    rows' int32 cumulative offsets, the longest row, causal window and GQA; with the stand-in ignoring the offsets
    (the negative control) the rows after the first attend across their boundary and the check fails."""
    attn = [m for m in pm.modules() if type(m).__name__ == "NemotronHAttention"]
    assert attn
    for m in attn:
        monkeypatch.setattr(m, "_packed_force_varlen", True, raising=False)
    rows = make_rows(LENGTHS)
    ref = run_rows(pm, rows)
    calls = []
    monkeypatch.setattr(packed_rows, "VARLEN_ATTN", _varlen_standin(calls))
    got = installed(pm, lambda: run_packed(pm, rows), attention="varlen")
    cfg = pm.config
    assert calls and calls[0]["cu"] == [0, 37, 127, 140, 210] and calls[0]["max"] == 90
    assert calls[0]["window"] == (-1, 0) and calls[0]["dtype"] == torch.int32
    assert calls[0]["shape"] == (210, cfg.num_attention_heads, cfg.head_dim)
    assert calls[0]["gqa"] == (cfg.num_key_value_heads != cfg.num_attention_heads)
    monkeypatch.setattr(packed_rows, "VARLEN_ATTN", _varlen_standin([], ignore_rows=True))
    bad = installed(pm, lambda: run_packed(pm, rows), attention="varlen")
    check_exact("packed rows, varlen_attn branch (stand-in)", got, ref, run_rows(pm64, rows), negative=bad)
