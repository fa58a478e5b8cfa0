"""Prompt parity with the real model: the tiny tokenizer's template against Nemotron-3-Nano's, and every SFT and
GRPO example against the scorer's prompt, rendered by the real template.

The real tokenizer (its `tokenizer.json` and the byte-identical `chat_template.jinja`) is read offline from
`../shared/tokenizer/nemotron-3-nano/` beside the repository; those tests skip when it is absent. Nothing from it
is in the repository.

Why the SFT example is "prompt text + completion text" and never a rendered conversation: the real template takes
`truncate_history_thinking` (default true) and, for an assistant turn followed by a user turn, keeps only what
follows `</think>`; it also trims the turn. `test_rendered_conversation_is_not_the_trained_text` shows the
difference, and the SFT test checks the tokens TRL trains on are exactly the completion's.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from lab.model import models
from lab.competition.prompts import BOXED_INSTRUCTION, chat_prompt
from lab.puzzles import CATEGORIES, generate

REAL = Path(__file__).resolve().parents[1].parent / "shared" / "tokenizer" / "nemotron-3-nano"
needs_real = pytest.mark.skipif(not (REAL / "tokenizer.json").is_file(), reason=f"{REAL} not present")


def scorer_prompt(puzzle: str) -> str:
    """Kaggle's prompt for the real model, written out: an empty system turn, the user turn, the thinking opener."""
    return (f"<|im_start|>system\n<|im_end|>\n<|im_start|>user\n{puzzle}\n{BOXED_INSTRUCTION}<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n")


@pytest.fixture(scope="module")
def real():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(REAL))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


@pytest.fixture(scope="module")
def tiny():
    return models.build_tiny_tokenizer()


@pytest.fixture(scope="module")
def puzzles():
    """Two generated puzzles of every category, and, when present, two real rows of every category."""
    frames = [generate(c, 2, 7) for c in CATEGORIES]
    dev = REAL.parents[1] / "data" / "train_dev.csv"
    if dev.is_file():
        from lab.puzzles import classify

        d = pd.read_csv(dev, dtype=str)
        d["category"] = [classify(p)[0] for p in d["prompt"]]
        frames.append(d.groupby("category").head(2))
    return pd.concat(frames, ignore_index=True)


def test_demo_prompts_carry_the_system_turn(tiny):
    assert chat_prompt(tiny, "2+2?") == scorer_prompt("2+2?")


CONVERSATIONS = [
    [{"role": "user", "content": "u1"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "u1"}],
    [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "plain answer  "}],
    [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "<think>\nsteps\n</think>\n\\boxed{1}\n"}],
    [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "steps</think>\\boxed{1}"},
     {"role": "user", "content": "u2"}],
    [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "<think>a</think>b"},
     {"role": "user", "content": "u2"}, {"role": "assistant", "content": "<think>c</think>d"}],
    [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "<think>open only"},
     {"role": "user", "content": "u2"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "u1"}, {"role": "assistant", "content": ""},
     {"role": "user", "content": "u2"}],
]


@needs_real
@pytest.mark.parametrize("i", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("flags", [dict(add_generation_prompt=True), dict(add_generation_prompt=False),
                                   dict(add_generation_prompt=True, enable_thinking=False),
                                   dict(add_generation_prompt=False, truncate_history_thinking=False)])
def test_tiny_template_renders_the_real_templates_bytes(real, tiny, i, flags):
    msgs = CONVERSATIONS[i]
    assert (tiny.apply_chat_template(msgs, tokenize=False, **flags)
            == real.apply_chat_template(msgs, tokenize=False, **flags))


@needs_real
def test_sft_examples_are_the_scorers_prompt_then_the_completion(real, puzzles, tmp_path):
    """Every SFT example (real tokenizer, every category): prompt == the scorer's prompt byte for byte; the text
    trained on is prompt + completion; the tokens TRL puts under the loss are exactly the completion's."""
    from lab.core import config
    from lab.model import lora
    from lab.train import sft, trl_private

    examples, counts = sft.sft_examples(real, puzzles, 8192)  # the competition preset's sequence budget
    assert set(examples["category"]) == set(CATEGORIES), counts
    by_id = puzzles.set_index("id")["prompt"]
    for _, ex in examples.iterrows():
        assert ex["prompt"] == scorer_prompt(by_id[ex["id"]])
        assert ex["completion"].endswith(real.eos_token) and not ex["completion"].startswith("<think>")

    cfg = config.compose([f"run_dir={tmp_path}", "sft.batch_size=2", "sft.max_seq_len=8192"])
    model, _ = models.load(cfg)  # the tiny model: only TRL's tokenisation of the dataset is looked at
    trl_private.install()
    pm, _ = lora.attach_lora(cfg, model)
    trainer = sft.build_trainer(cfg, tmp_path / "ck", pm, real, examples)
    assert len(trainer.train_dataset) == len(examples)
    for row, (_, ex) in zip(trainer.train_dataset, examples.iterrows()):
        p_ids = real(ex["prompt"], add_special_tokens=False)["input_ids"]
        c_ids = real(ex["completion"], add_special_tokens=False)["input_ids"]
        assert row["input_ids"] == real(ex["prompt"] + ex["completion"], add_special_tokens=False)["input_ids"]
        assert row["input_ids"][:len(p_ids)] == p_ids  # the prompt ends on a token boundary (`<think>\n`)
        trained = [t for t, label in zip(row["input_ids"], row["labels"]) if label != -100]
        assert trained == row["input_ids"][len(p_ids):] == c_ids
        assert real.decode(trained) == ex["completion"]


@needs_real
def test_grpo_prompts_are_the_scorers_prompt(real, puzzles):
    """GRPO trains on completions the model generates after the dataset's prompt: that prompt must be the scorer's,
    and its tokens the same whether or not special tokens are added (TRL's GRPO tokenises with the default)."""
    from lab.train import grpo

    ds = grpo.build_dataset(real, puzzles)
    assert len(ds) == len(puzzles) and set(ds["category"]) == set(CATEGORIES)
    for row, (_, pz) in zip(ds, puzzles.iterrows()):
        assert row["prompt"] == scorer_prompt(pz["prompt"]) == chat_prompt(real, pz["prompt"])
        assert real(row["prompt"])["input_ids"] == real(row["prompt"], add_special_tokens=False)["input_ids"]


@needs_real
def test_rendered_conversation_is_not_the_trained_text(real):
    """The pitfall the SFT examples avoid: through the real template, an assistant turn is trimmed, and with a later
    user turn (truncate_history_thinking, on by default) its reasoning is dropped."""
    prompt = chat_prompt(real, "p")
    completion = "step 1\n</think>\n\\boxed{1}" + real.eos_token
    one = real.apply_chat_template([{"role": "user", "content": f"p\n{BOXED_INSTRUCTION}"},
                                    {"role": "assistant", "content": "<think>\n" + completion[:-len(real.eos_token)]}],
                                   tokenize=False)
    assert one == prompt + completion + "\n"  # only the final newline differs for the last turn...
    two = real.apply_chat_template([{"role": "user", "content": "p"},
                                    {"role": "assistant", "content": "<think>\nstep 1\n</think>\n\\boxed{1}"},
                                    {"role": "user", "content": "q"}], tokenize=False)
    assert "step 1" not in two  # ...but an earlier turn loses its reasoning
    assert "<|im_start|>assistant\n<think></think>\n\\boxed{1}<|im_end|>\n<|im_start|>user\nq" in two


@needs_real
def test_sft_and_grpo_data_read_the_trace_style(real, puzzles):
    """`data.trace_style: derivation`: SFT completions and the GRPO rows' solver_trace are the derivation traces
    (the answers are the solver's either way), and the derivations fit the competition's sequence budget."""
    from lab.train import grpo, sft
    from lab.puzzles import solve

    examples, counts = sft.sft_examples(real, puzzles, 8192, "derivation")
    assert set(examples["category"]) == set(CATEGORIES), counts
    by_id = puzzles.set_index("id")["prompt"]
    for _, ex in examples.iterrows():
        assert ex["completion"] == solve(by_id[ex["id"]], style="derivation").trace + real.eos_token
    ds = grpo.build_dataset(real, puzzles.head(6), "derivation")
    for row, (_, pz) in zip(ds, puzzles.head(6).iterrows()):
        sol = solve(pz["prompt"], style="derivation")
        assert row["solver_trace"] == (sol.trace if sol.status == "solved" else "")
