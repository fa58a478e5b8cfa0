"""Packed GRPO training (`grpo.packing`): a micro-batch's completions trained in packs of at most `grpo.pack_tokens`
tokens (rows whole, each row's Mamba state and attention its own through `lab.model.packed_rows`), with TRL's loss
for the loss types in LOSS_TYPES formed pack by pack so the parts add up to TRL's (`micro_batch_loss`); what TRL
offers beyond those is refused (`check_supported`). `grpo.old_logprobs`: "trainer" scores them packed, "sampler" takes
the rollout's. The normalisers and the TRL source they are read from: docs/internals.md.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable

import torch

from lab import LabError

LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo", "cispo")  # grpo.loss_type: TRL's, the ones packing computes
OLD_LOGPROBS = ("trainer", "sampler")  # grpo.old_logprobs


@dataclass
class Row:
    """One completion of the micro-batch: its index, its tokens (prompt then completion, no padding) and lengths."""
    index: int
    ids: torch.Tensor
    prompt_len: int
    completion_len: int


def rows(prompt_ids, prompt_mask, completion_ids, completion_mask) -> list[Row]:
    """The micro-batch's rows with something to score: the prompt's unmasked tokens (TRL pads prompts on the left)
    and the completion's first n tokens, n = its mask's sum; the mask must be a prefix (TRL's: up to the first EOS,
    all zero when truncated and masked). Rows with n = 0 are left out."""
    out = []
    for b in range(completion_ids.shape[0]):
        n = int(completion_mask[b].sum())
        if n == 0:
            continue
        if not bool(completion_mask[b, :n].all()):
            raise LabError("grpo.packing: a completion mask is not a prefix of its row (TRL masks up to the first "
                           "EOS); packing cannot lay this row out")
        prompt = prompt_ids[b][prompt_mask[b].bool()]
        out.append(Row(b, torch.cat([prompt, completion_ids[b, :n]]), int(prompt.numel()), n))
    return out


def bfd(lengths: list[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing: indices into `lengths`, longest first, each into the fullest bin it fits; the bins."""
    free: list[tuple[int, int]] = []  # (room left, bin), sorted
    bins: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        t = lengths[i]
        if t > capacity:
            raise LabError(f"grpo.pack_tokens={capacity}: a prompt + completion of {t} tokens does not fit one pack")
        j = bisect.bisect_left(free, (t, -1))
        if j == len(free):
            bins.append([i])
            bisect.insort(free, (capacity - t, len(bins) - 1))
        else:
            room, k = free.pop(j)
            bins[k].append(i)
            bisect.insort(free, (room - t, k))
    return bins


def packs(batch_rows: list[Row], capacity: int) -> list[list[Row]]:
    """`batch_rows` in packs of at most `capacity` tokens (`bfd`)."""
    return [[batch_rows[i] for i in b] for b in bfd([int(r.ids.numel()) for r in batch_rows], capacity)]


def pack_forward(model, pack: list[Row], compute_entropy: bool, boundaries: bool = True):
    """[(log-probs (n,), entropies (n,) or None)] of each row's completion tokens, from one forward of the pack
    through TRL's fused head (`model(..., labels=, fused_lm_head=True)`). `boundaries=False` (the tests' negative
    control) numbers the pack's positions straight through, so rows see each other."""
    device = next(model.parameters()).device
    ids = torch.cat([r.ids for r in pack]).to(device)
    if boundaries:
        pos = torch.cat([torch.arange(r.ids.numel()) for r in pack])
    else:
        pos = torch.arange(ids.numel())
    labels = torch.full_like(ids, -100)
    spans, start = [], 0
    for r in pack:
        a = start + r.prompt_len
        labels[a:a + r.completion_len] = ids[a:a + r.completion_len]
        spans.append((a - 1, a - 1 + r.completion_len))  # the head shifts by one: position t predicts t + 1
        start += int(r.ids.numel())
    out = model(input_ids=ids[None], position_ids=pos[None].to(device), labels=labels[None], fused_lm_head=True)
    logps = out.log_probs[0]
    ent = out.entropy[0] if compute_entropy and out.entropy is not None else None
    return [(logps[s:e], None if ent is None else ent[s:e]) for s, e in spans]


def scatter(values: list[tuple[Row, torch.Tensor]], shape, like: torch.Tensor) -> torch.Tensor:
    """Per-row values back into a (rows, completion) tensor, zero elsewhere (TRL's layout)."""
    out = like.new_zeros(shape)
    for r, v in values:
        out[r.index, :r.completion_len] = v
    return out


def per_token_logps(model, input_ids, attention_mask, logits_to_keep: int, capacity: int,
                    compute_entropy: bool = False):
    """TRL's `_get_per_token_logps_and_entropies` output, (log-probs, entropies or None), computed packed:
    input_ids / attention_mask are TRL's (rows, prompt + completion), the last `logits_to_keep` columns the
    completion. Runs under the caller's grad mode and autocast."""
    P = input_ids.shape[1] - logits_to_keep
    batch = rows(input_ids[:, :P], attention_mask[:, :P], input_ids[:, P:], attention_mask[:, P:])
    got_lp, got_ent = [], []
    for pack in packs(batch, capacity):
        for r, (lp, ent) in zip(pack, pack_forward(model, pack, compute_entropy)):
            got_lp.append((r, lp))
            got_ent.append((r, ent))
    shape = (input_ids.shape[0], logits_to_keep)
    like = torch.zeros((), dtype=torch.float32, device=input_ids.device)
    if got_lp:
        like = got_lp[0][1]
    logps = scatter(got_lp, shape, like)
    ents = scatter(got_ent, shape, like) if compute_entropy else None
    return logps, ents


@dataclass
class Settings:
    """What `micro_batch_loss` needs from the trainer (`lab.train.trl_private.packed_settings` reads it)."""
    loss_type: str
    epsilon_low: float
    epsilon_high: float
    delta: float | None
    beta: float
    bias_correction_kl: bool
    accumulation_steps: int       # the current gradient accumulation steps (1 outside training)
    steps_per_generation: int     # TRL's (1 outside training)
    num_processes: int
    max_completion_length: int
    pack_tokens: int
    train: bool = True


def row_loss(s: Settings, lp, old, adv, ref=None):
    """TRL's per-token loss of one row's tokens (`_compute_loss`, token-level ratio), and its clip flags."""
    coef_1 = torch.exp(lp - old)
    if s.loss_type == "cispo":
        loss = -torch.clamp(coef_1, max=s.epsilon_high).detach() * adv * lp
    else:
        coef_2 = torch.clamp(coef_1, 1 - s.epsilon_low, 1 + s.epsilon_high)
        c1 = torch.clamp(coef_1, max=s.delta) if s.delta is not None else coef_1
        loss = -torch.min(c1 * adv, coef_2 * adv)
    if s.beta != 0.0:
        kl = torch.exp(ref - lp) - (ref - lp) - 1
        if s.bias_correction_kl:
            kl = kl * coef_1
        loss = loss + s.beta * kl
    low = (coef_1 < 1 - s.epsilon_low) & (adv < 0)
    high = (coef_1 > 1 + s.epsilon_high) & (adv > 0)
    return loss, low.detach(), high.detach()


def normaliser(s: Settings, inputs: dict, n_rows: int, tokens: int) -> tuple[str, float | torch.Tensor]:
    """What each loss type divides the summed token losses by ('per_row': grpo, rows' means first)."""
    accum = s.accumulation_steps if s.train else 1
    if s.loss_type == "grpo":
        return "per_row", float(n_rows * accum)
    if s.loss_type == "bnpo":
        return "sum", float(max(tokens, 1) * accum)
    if s.loss_type == "dr_grpo":
        return "sum", float(n_rows * s.max_completion_length * accum)
    if s.loss_type in ("dapo", "cispo"):
        norm = inputs["num_items_in_batch"].clamp(min=1.0) / s.num_processes
        if s.train:
            norm = norm * s.accumulation_steps / s.steps_per_generation
        return "sum", norm
    raise LabError(f"grpo.loss_type={s.loss_type!r}: packing computes {', '.join(LOSS_TYPES)}")


def micro_batch_loss(model, inputs: dict, s: Settings, backward: Callable | None = None, boundaries: bool = True):
    """TRL's loss of one micro-batch (module docstring), pack by pack: every pack's part but the last is handed to
    `backward` (if given) as soon as it is formed; returns (the last part + the earlier parts detached, stats) so
    the returned value is the micro-batch loss and its backward completes the gradient. `stats` holds detached
    sums for TRL's metrics: entropy, clip flags, token and row counts."""
    completion_mask = inputs["completion_mask"]
    batch = rows(inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"], completion_mask)
    kind, norm = normaliser(s, inputs, int(completion_mask.shape[0]), int(completion_mask.sum()))
    adv = inputs["advantages"]
    old_all, ref_all = inputs.get("old_per_token_logps"), inputs.get("ref_per_token_logps")
    stats = {"entropy": 0.0, "low": 0.0, "high": 0.0, "tokens": 0, "logp_gap_sum": 0.0, "logp_gap_max": 0.0,
             "gap_tokens": 0}
    sampling = inputs.get("sampling_per_token_logps")
    done, last = None, None
    groups = packs(batch, s.pack_tokens)
    for i, pack in enumerate(groups):
        part = None
        for r, (lp, ent) in zip(pack, pack_forward(model, pack, True, boundaries)):
            n = r.completion_len
            old = lp.detach() if old_all is None else old_all[r.index, :n]
            old = torch.where(torch.isnan(old), lp.detach(), old)  # a sampler token without log-prob: no correction
            ref = None if ref_all is None else ref_all[r.index, :n]
            loss, low, high = row_loss(s, lp, old, adv[r.index], ref)
            term = loss.sum() / n if kind == "per_row" else loss.sum()
            part = term if part is None else part + term
            stats["entropy"] += float(ent.detach().sum())
            stats["low"] += float(low.sum())
            stats["high"] += float(high.sum())
            stats["tokens"] += n
            if sampling is not None:
                d = (lp.detach() - sampling[r.index, :n]).abs()
                d = d[torch.isfinite(d)]
                if d.numel():
                    stats["logp_gap_sum"] += float(d.sum())
                    stats["logp_gap_max"] = max(stats["logp_gap_max"], float(d.max()))
                    stats["gap_tokens"] += int(d.numel())
        part = part / norm
        if i < len(groups) - 1:
            if backward is not None:
                backward(part)
            done = part.detach() if done is None else done + part.detach()
        else:
            last = part
    if last is None:  # nothing to score: a zero loss that still reaches the trainable parameters (TRL's is one too)
        last = sum((p.sum() * 0.0 for p in model.parameters() if p.requires_grad), torch.zeros(()))
    return (last if done is None else last + done), stats


def check_supported(trainer_args, loss_type: str) -> None:
    """LabError for a GRPOConfig setting `micro_batch_loss` does not compute (TRL's meaning would be lost)."""
    a = trainer_args
    if loss_type not in LOSS_TYPES:
        raise LabError(f"grpo.loss_type={loss_type!r} with grpo.packing: one of {', '.join(LOSS_TYPES)}")
    bad = {"importance_sampling_level": (a.importance_sampling_level, "token"),
           "top_entropy_quantile": (a.top_entropy_quantile, 1.0), "entropy_coef": (a.entropy_coef, 0.0),
           "off_policy_mask_threshold": (a.off_policy_mask_threshold, None), "use_vllm": (a.use_vllm, False)}
    wrong = [f"{k}={v!r} (packing needs {want!r})" for k, (v, want) in bad.items() if v != want]
    if getattr(a, "use_adaptive_entropy", False):
        wrong.append("use_adaptive_entropy")
    if wrong:
        raise LabError("grpo.packing computes TRL's loss for token-level ratios only; this GRPOConfig sets "
                       + ", ".join(wrong))
