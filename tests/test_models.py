"""The tiny Nemotron-H default: real module names, Nemotron chat conventions, deterministic build, generation."""

import json

import pytest

from lab.eval import sampling as S
from lab.model import generate as G
from lab.model import models
from lab import LabError
from lab.core.config import compose
from lab.competition.prompts import BOXED_INSTRUCTION, chat_prompt, user_message

PUZZLE = ("In Alice's Wonderland, numbers are secretly converted into a different numeral system. Some examples are "
          "given below:\n11 -> XI\n15 -> XV\nNow, write the number 38 in the Wonderland numeral system.")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = compose([f"run_dir={tmp_path_factory.mktemp('run')}"])
    model, tok = models.load(cfg)
    return cfg, model, tok


def test_tiny_model_has_the_real_module_families(tiny):
    _, model, _ = tiny
    assert type(model).__name__ == "NemotronHForCausalLM"
    names = {n for n, _ in model.named_parameters()}
    for suffix in ["mixer.in_proj.weight", "mixer.out_proj.weight", "mixer.conv1d.weight", "mixer.q_proj.weight",
                   "mixer.o_proj.weight", "mixer.experts.up_proj", "mixer.experts.down_proj",
                   "mixer.shared_experts.up_proj.weight", "mixer.gate.weight", "lm_head.weight"]:
        assert any(n.endswith(suffix) for n in names), suffix
    moe = next(l.mixer for l in model.model.layers if hasattr(l.mixer, "experts"))
    assert moe.experts.up_proj.dim() == 3  # fused experts, as in transformers 5.x


def test_chat_template_follows_nemotron_conventions(tiny):
    _, _, tok = tiny
    p = chat_prompt(tok, PUZZLE)
    assert p == (f"<|im_start|>system\n<|im_end|>\n<|im_start|>user\n{PUZZLE}\n{BOXED_INSTRUCTION}<|im_end|>\n"
                 "<|im_start|>assistant\n<think>\n")  # the real template's empty system turn (tests/test_prompts.py)
    assert user_message(PUZZLE).endswith("For example: `\\boxed{your answer}`")
    assert tok.decode(tok(p, add_special_tokens=False)["input_ids"]) == p
    assert tok.eos_token == "<|im_end|>"
    off = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True,
                                  enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think></think>")


def test_tiny_build_is_deterministic(tmp_path):
    a = compose([f"run_dir={tmp_path}/a"])
    b = compose([f"run_dir={tmp_path}/b"])
    ma, _ = models.load(a)
    mb, _ = models.load(b)
    for (n, pa), (_, pb) in zip(ma.named_parameters(), mb.named_parameters()):
        assert (pa == pb).all(), n
    assert json.loads((tmp_path / "a" / "base_model" / "config.json").read_text())["model_type"] == "nemotron_h"


def test_a_stale_tiny_model_is_refused_naming_what_changed(tmp_path):
    models.load(compose([f"run_dir={tmp_path}"]))
    with pytest.raises(LabError, match=r"architecture.num_attention_heads: 16 -> 8"):
        models.load(compose([f"run_dir={tmp_path}", "model.architecture.num_attention_heads=8"]))
    with pytest.raises(LabError, match="seed: 1234 -> 7"):
        models.load(compose([f"run_dir={tmp_path}", "seed=7"]))
    (tmp_path / "base_model" / models.RECIPE_FILE).unlink()
    with pytest.raises(LabError, match="missing or unreadable"):
        models.load(compose([f"run_dir={tmp_path}"]))


def test_tiny_tokenizer_spells_numbers_and_numerals_the_same_everywhere(tiny):
    _, _, tok = tiny
    for text in ["XXXVIII", " XXXVIII", "30 -> XXX", "XXX + VIII = XXXVIII", "\\boxed{XXXVIII}"]:
        pieces = [tok.decode([i]) for i in tok(text, add_special_tokens=False)["input_ids"]]
        letters = [p.strip() for p in pieces if p.strip().isalpha() and p.strip().isupper()]
        assert all(len(p) == 1 for p in letters), pieces
    assert [tok.decode([i]) for i in tok("1994", add_special_tokens=False)["input_ids"]] == list("1994")


def test_generation_budget_and_finish_reason(tiny):
    cfg, model, tok = tiny
    prompts = [chat_prompt(tok, PUZZLE)]
    assert G.completion_budget(tok, prompts, 7680, 8192) == 7680
    assert G.completion_budget(tok, prompts, 7680, 100 + len(tok(prompts[0])["input_ids"])) == 100
    out = G.generate_hf(model, tok, prompts * 2, G.Sampling(max_tokens=5), progress=False)
    assert [c.finish_reason for c in sum(out, [])] == ["length", "length"] and out[0][0].tokens == 5
    assert out[0][0].text == out[1][0].text  # greedy is deterministic
    spec = G.Sampling(max_tokens=5, n=3, temperature=1.0, logprobs=True)
    s = G.generate_hf(model, tok, prompts, spec, progress=False)
    assert len(s[0]) == 3 and len(s[0][0].logprobs) == 5 and all(lp <= 0 for lp in s[0][0].logprobs)


def test_sample_table_resumes_from_its_cache(tiny, tmp_path, monkeypatch):
    cfg, model, tok = tiny
    cfg = compose([f"run_dir={cfg.run_dir}", "infer.max_tokens=4"])
    gen = G.Generator(cfg, model=model, tokenizer=tok)
    import pandas as pd

    puzzles = pd.DataFrame({"id": ["a", "b", "c"], "prompt": [PUZZLE] * 3, "answer": ["XXXVIII"] * 3})
    cache = tmp_path / "samples.jsonl"
    first = S.sample_table(gen, puzzles.head(2), G.Sampling.competition(cfg, n=2), cache=cache, progress=False)
    assert len(first) == 4 and set(first.columns) == set(S.SAMPLE_COLUMNS)
    with open(cache, "a") as f:
        f.write('{"id": "c", "trunc')  # a write cut short by a kill
    calls = []
    real = gen.run
    monkeypatch.setattr(gen, "run", lambda prompts, **kw: calls.append(len(prompts)) or real(prompts, **kw))
    full = S.sample_table(gen, puzzles, G.Sampling.competition(cfg, n=2), cache=cache, progress=False)
    assert calls == [1] and len(full) == 6 and list(full["id"]) == ["a", "a", "b", "b", "c", "c"]
