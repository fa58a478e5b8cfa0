"""A LoRA on `lm_head` that TRL 1.15's trainers really train, with the logits never materialised whole.

TRL 1.15's SFTTrainer and GRPOTrainer compute the per-token log-probabilities through a fused LM head
(`trl/trainer/utils.py`, `add_fused_lm_head`): the patched forward runs the backbone and hands
`get_output_embeddings().weight` to `ChunkedLogProbFunction` (`trl/kernels/chunked_logprob.py`), which
tiles over the vocabulary. A PEFT LoRA on `lm_head` is a wrapper module whose `.weight` is the frozen base
weight, so the adapter would be ignored; both trainers therefore refuse it in `__init__`
(`isinstance(model.get_output_embeddings(), BaseTunerLayer)`, `trl/trainer/sft_trainer.py` and
`grpo_trainer.py`).

The LoRA head is itself one linear map over a wider input: `W h + s B A h = [W | B] [h ; s A h]`. So:
- `trainer_accepts_head_lora(model)` shows the trainer the base `lm_head` while it is built (the only
  place the refusal and the fused-head patch look at it);
- `install_fused_lora_head(model, ...)` then wraps TRL's fused forward: when the head carries an active
  LoRA, the hidden states of the labelled positions are extended with `s A(dropout(h))` for each active
  adapter and the weight with the matching `B`, and the same `ChunkedLogProbFunction` runs on them. The
  logits are still built tile by tile (never `tokens x vocabulary` at once, the extra memory is one
  `[vocab, hidden + r]` copy of the head and its fp32 gradient), and autograd carries the gradient to `A`
  and `B`. Without a LoRA on the head, or for ordinary (non-fused) calls, TRL's forward runs unchanged.

What it simplifies: no second loss implementation (TRL's kernel, masking and loss normalisation are reused),
no full logits, and generation (`model.generate`, vLLM) is untouched because the module itself is not changed.
Not supported (refused with an error): DoRA or a LoRA bias on `lm_head`, MoE router logits in the fused
call (Nemotron-H has none), logit soft-capping or scaling (Nemotron-H uses neither), DeepSpeed ZeRO-3 (the
head's weights are read outside its module). Not verified without a GPU: TRL's Triton kernel on the
concatenated head (the CPU tests run the same computation through lab.trl_cpu).
"""

from __future__ import annotations

import contextlib
import functools
import types

from lab.config import LabError


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def head_lora(model):
    """The PEFT LoRA layer on the output head, or None when the head has no LoRA."""
    from peft.tuners.lora import LoraLayer

    head = _base(model).get_output_embeddings()
    return head if isinstance(head, LoraLayer) else None


@contextlib.contextmanager
def trainer_accepts_head_lora(model):
    """While a TRL trainer is constructed, `get_output_embeddings()` returns the head's frozen base layer.

    TRL's refusal and `add_fused_lm_head` both run in the trainer's `__init__`; afterwards
    `install_fused_lora_head` makes the fused head use the LoRA, so the refusal's reason no longer holds.
    """
    head = head_lora(model)
    if head is None:
        yield
        return
    base = _base(model)
    base.get_output_embeddings = lambda: head.base_layer  # an instance attribute shadows the method
    try:
        yield
    finally:
        del base.get_output_embeddings


def head_as_linear(head, x):
    """(hidden, weight, bias) of one linear map equal to the LoRA head applied to `x` ([tokens, hidden]).

    `W x + sum_a s_a B_a A_a drop_a(x)` = `[W | B_1 | ...] @ [x ; s_1 A_1 drop_1(x) ; ...]`; both parts in the
    base weight's dtype (what autocast does to PEFT's own LoRA matmuls in bf16 training).
    """
    import torch

    base = head.base_layer
    xs, ws = [x.to(base.weight.dtype)], [base.weight]
    if not (head.disable_adapters or head.merged):
        for name in head.active_adapters:
            if name not in head.lora_A:
                continue
            if head.use_dora.get(name) or getattr(head, "lora_bias", {}).get(name):
                raise LabError(f"lm_head LoRA adapter '{name}': DoRA and LoRA bias on lm_head are not supported by "
                               "lab.lora's fused head; use a plain LoRA")
            a, b = head.lora_A[name], head.lora_B[name]
            xs.append((head.scaling[name] * a(head.lora_dropout[name](x.to(a.weight.dtype)))).to(base.weight.dtype))
            ws.append(b.weight.to(base.weight.dtype))
    if len(xs) == 1:
        return xs[0], ws[0], base.bias
    return torch.cat(xs, -1), torch.cat(ws, 1), base.bias


def install_fused_lora_head(model, temperature: float = 1.0,
                            outputs: tuple[str, ...] = ("log_probs", "entropy", "is_top1")) -> bool:
    """Wrap the fused forward TRL installed (call after building the trainer); True if the head has a LoRA.

    `temperature` and `outputs` must be the ones the trainer gave `add_fused_lm_head` (SFT: 1.0 and
    log_probs/entropy/is_top1; GRPO: its sampling temperature and log_probs/entropy).
    """
    import trl.trainer.utils as tu

    if head_lora(model) is None:
        return False
    base = _base(model)
    trl_forward = base.forward
    if getattr(trl_forward, "_lab_lora_head", False):
        return True
    from transformers.integrations import is_deepspeed_zero3_enabled

    if is_deepspeed_zero3_enabled():
        raise LabError("lm_head LoRA under DeepSpeed ZeRO-3: lab.lora reads the head's weights outside its module, "
                       "where ZeRO-3 leaves them sharded; use accelerate=ddp or deepspeed_zero2, or drop lm_head")
    tc = base.config.get_text_config()
    for key in ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling"):
        if getattr(tc, key, None) not in (None, 1.0):
            raise LabError(f"lm_head LoRA: the model's config sets {key}={getattr(tc, key)!r}, which lab.lora's fused "
                           "head does not apply; drop lm_head from the LoRA targets for this model")

    @functools.wraps(type(base).forward)
    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kw):
        head = head_lora(self)
        if not fused_lm_head or head is None:
            return trl_forward(*args, fused_lm_head=fused_lm_head, labels=labels, shift_labels=shift_labels,
                               num_items_in_batch=num_items_in_batch, **kw)
        if kw.get("output_router_logits") or getattr(tc, "output_router_logits", False):
            raise LabError("lm_head LoRA: MoE router logits in the fused head are not supported by lab.lora")
        kw["use_cache"] = False
        hidden = self.base_model(*args, **kw).last_hidden_state
        if shift_labels is None:
            hidden, labels = hidden[:, :-1], labels[:, 1:]
        else:
            labels = shift_labels
        hidden, labels = hidden.to(head.base_layer.weight.device), labels.to(head.base_layer.weight.device)
        mask = labels != -100
        h, w, b = head_as_linear(head, hidden[mask])
        per_token = tu._ChunkedLogProbFunction.apply(h, w, b, labels[mask], temperature,
                                                     tu._CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, outputs)
        log_probs, entropy, lssp, mean_logits, is_top1 = (
            None if t is None else t.new_zeros(mask.shape).masked_scatter(mask, t) for t in per_token)
        loss = -log_probs.sum() / (mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch)
        return tu.FusedCausalLMOutput(loss=loss, log_probs=log_probs, entropy=entropy, log_sum_sq_probs=lssp,
                                      mean_logits=mean_logits, is_top1=is_top1, label_mask=mask)

    forward._lab_lora_head = True
    base.forward = types.MethodType(forward, base)
    if hasattr(model, "save_pretrained"):
        # PEFT's save_embedding_layers="auto" (the Trainer's checkpoints) would add the frozen lm_head
        # (vocabulary x hidden) to every checkpoint once lm_head is a target; keep checkpoints LoRA-only.
        model.save_pretrained = functools.partial(model.save_pretrained, save_embedding_layers=False)
    return True
