"""Every artefact a rerun trusts is keyed by what produced it: 04_vote's sample cache (and every evaluation that
passes a cache to `lab.model.generate.sample_table`), GRPO's run record, sweep jobs. A mismatch starts fresh (or refuses);
a match is reused."""

import json

import pandas as pd
import pytest

from lab.model import generate as G
from lab.model import models
from lab.core.config import compose
from lab.core.io import atomic_write_json

PUZZLE = ("In Alice's Wonderland, numbers are secretly converted into a different numeral system. Some examples are "
          "given below:\n11 -> XI\n15 -> XV\nNow, write the number 38 in the Wonderland numeral system.")
PUZZLES = pd.DataFrame({"id": ["a", "b", "c"], "prompt": [PUZZLE] * 3, "answer": ["XXXVIII"] * 3})


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    cfg = compose([f"run_dir={root}", "infer.max_tokens=4"])
    model, tok = models.load(cfg)
    return root, model, tok


def _adapter(model, folder, seed: int):
    """A LoRA adapter on the tiny model with its B matrices drawn from `seed` (so it changes the outputs)."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    pm = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    pm.save_pretrained(str(folder))
    pm.unload()  # back to the plain base model for the next caller


def _counting(gen, monkeypatch):
    calls = []
    real = gen.run
    monkeypatch.setattr(gen, "run", lambda prompts, **kw: calls.append(len(prompts)) or real(prompts, **kw))
    return calls


def _vote_samples(root, tok, monkeypatch, *over, adapter=None, k=2, temperature=0.5, top_p=1.0):
    """sample_table as notebooks/04_vote.ipynb calls it; returns (table, prompts generated for)."""
    # the built base model, loaded as a plain folder: a new seed must not ask for another tiny build
    cfg = compose([f"run_dir={root}", "infer.max_tokens=4", f"model.path={root / 'base_model'}",
                   "model.build_tiny=false", *over])
    gen = G.Generator(cfg, adapter=adapter) if adapter else G.Generator(cfg, model=models.load(cfg)[0], tokenizer=tok)
    calls = _counting(gen, monkeypatch)
    spec = G.Sampling.competition(cfg, n=k, temperature=temperature, top_p=top_p, logprobs=True)
    t = G.sample_table(gen, PUZZLES, spec, cache=root / "samples.jsonl", progress=False)
    return t, sum(calls)


def test_vote_samples_rerun_with_same_settings_reuses_them(run, monkeypatch):
    root, _, tok = run
    (root / "samples.jsonl").unlink(missing_ok=True)
    first, n1 = _vote_samples(root, tok, monkeypatch)
    again, n2 = _vote_samples(root, tok, monkeypatch)
    assert n1 == 3 and n2 == 0
    pd.testing.assert_frame_equal(first, again)


@pytest.mark.parametrize("change", [{"temperature": 0.9}, {"top_p": 0.8}, {"k": 3}, {"over": ("seed=7",)},
                                    {"over": ("infer.max_tokens=3",)}])
def test_vote_samples_rerun_with_other_settings_regenerates(run, monkeypatch, change):
    root, _, tok = run
    (root / "samples.jsonl").unlink(missing_ok=True)
    _vote_samples(root, tok, monkeypatch)
    t, n = _vote_samples(root, tok, monkeypatch, *change.get("over", ()), k=change.get("k", 2),
                         temperature=change.get("temperature", 0.5), top_p=change.get("top_p", 1.0))
    assert n == 3 and len(t) == 3 * change.get("k", 2)
    assert sorted(t["sample"].unique()) == list(range(change.get("k", 2)))
    key = json.loads((root / "samples.jsonl").read_text().splitlines()[0])["key"]
    assert key["temperature"] == change.get("temperature", 0.5) and key["n"] == change.get("k", 2)
    assert key["top_p"] == change.get("top_p", 1.0)


def test_vote_samples_rerun_with_a_retrained_adapter_regenerates(run, tmp_path, monkeypatch):
    root, model, tok = run
    cache = root / "samples.jsonl"
    cache.unlink(missing_ok=True)
    adapter = tmp_path / "adapter"
    _adapter(model, adapter, seed=1)
    first, n1 = _vote_samples(root, tok, monkeypatch, adapter=adapter)
    _, n_same = _vote_samples(root, tok, monkeypatch, adapter=adapter)
    _adapter(model, adapter, seed=2)  # retrained in place: same path, other weights
    second, n2 = _vote_samples(root, tok, monkeypatch, adapter=adapter)
    assert (n1, n_same, n2) == (3, 0, 3)
    assert json.loads(cache.read_text().splitlines()[0])["key"]["adapter_sha256"] == G.content_hash(adapter)


def test_a_puzzle_counts_as_done_only_with_all_its_samples(run, monkeypatch):
    root, _, tok = run
    cache = root / "samples.jsonl"
    cache.unlink(missing_ok=True)
    full, _ = _vote_samples(root, tok, monkeypatch, k=3)
    lines = cache.read_text().splitlines()
    kept = [l for l in lines if json.loads(l).get("id") != "c" or json.loads(l)["sample"] == 0]
    cache.write_text("\n".join(kept) + "\n")  # puzzle c flushed part-way: 1 of its 3 samples
    t, n = _vote_samples(root, tok, monkeypatch, k=3)
    assert n == 1 and (t.groupby("id").size() == 3).all() and len(t) == 9
    pd.testing.assert_frame_equal(t[t["id"] != "c"], full[full["id"] != "c"])  # complete puzzles reused as they were


def test_sweep_job_with_a_changed_default_is_not_done(tmp_path, monkeypatch):
    """Same overrides, another resolved config (a default in conf/ changed since): the job runs again."""
    from lab.runs import sweep as sw

    d = tmp_path / "seed=1"
    nb = ["seed=1", f"run_dir={sw.quote(d)}"]
    for stage in ("01_explore",):
        atomic_write_json(d / stage / "metrics.json", {"n_train": 1})
    key = sw.config_key(sw.job_config(nb))
    atomic_write_json(d / "done.json", {"stages": ["01_explore"], "overrides": ["seed=1"], "config_sha256": key})
    assert sw.is_done(d, ["01_explore"], ["seed=1"], key)
    changed = sw.config_key(sw.job_config([*nb, "sft.learning_rate=0.5"]))
    assert not sw.is_done(d, ["01_explore"], ["seed=1"], changed)
    ran = []
    monkeypatch.setattr(sw, "execute_stage", lambda stage, job_dir, nbo, **kw: ran.append(stage) or atomic_write_json(
        job_dir / stage / "metrics.json", {}))
    monkeypatch.setattr(sw, "job_config", lambda nbo: {"changed": True})  # conf/ changed since the job finished
    assert sw.run_job(d, ["seed=1"], ["01_explore"])["status"] == "finished" and ran == ["01_explore"]


def test_grpo_run_record_is_keyed_by_the_base_models_content(run, tmp_path):
    """GRPO's pass rates and prompt order (its run record) are reused only from the same base model files."""
    from lab.train import grpo
    from lab import LabError

    root, model, _ = run
    base = tmp_path / "base_model"
    import shutil

    shutil.copytree(root / "base_model", base)
    cfg = compose([f"run_dir={tmp_path}", f"model.path={base}"])
    fp = grpo.fingerprint(cfg, ["a"], model, 8)
    out = tmp_path / "checkpoints"
    (out / "checkpoint-1").mkdir(parents=True)
    from lab.train.checkpoints import mark_complete

    mark_complete(out / "checkpoint-1")  # a checkpoint counts only when complete (lab.train.checkpoints)
    atomic_write_json(out / grpo.RUN_RECORD, {"fingerprint": fp, "order": ["a"]})
    assert grpo.resume_point(cfg, out, grpo.fingerprint(cfg, ["a"], model, 8))[1] is not None
    (base / "generation_config.json").write_text((base / "generation_config.json").read_text() + "\n")
    with pytest.raises(LabError, match="model_sha256"):
        grpo.resume_point(cfg, out, grpo.fingerprint(cfg, ["a"], model, 8))


def test_sweep_keeps_a_finished_stage_only_under_the_same_resolved_config(tmp_path):
    from lab.runs import sweep as sw
    from lab.core.run import Stage

    nb = ["seed=1", "sft.learning_rate=3e-3", f"run_dir={sw.quote(tmp_path)}"]
    Stage("01_explore", nb).finish({})
    assert sw._stage_kept(tmp_path, "01_explore", nb, sw.job_config(nb))
    assert not sw._stage_kept(tmp_path, "01_explore", nb, sw.job_config([*nb, "sft.epochs=2"]))
