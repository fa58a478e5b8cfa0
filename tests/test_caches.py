"""Every artefact a rerun trusts is keyed by what produced it: 04_vote's sample cache (and every evaluation that
passes a cache to `lab.eval.sampling.sample_table`), GRPO's run record, sweep jobs. A mismatch starts fresh (or
refuses); a match is reused."""

import json

import pandas as pd
import pytest

from lab.eval import sampling as S
from lab.model import generate as G
from lab.model import models
from lab.core import lineage
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
    t = S.sample_table(gen, PUZZLES, spec, cache=root / "samples.jsonl", progress=False)
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
    assert json.loads(cache.read_text().splitlines()[0])["key"]["adapter_sha256"] == lineage.content_hash(adapter)


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
    from lab.runs import jobs, sweep as sw

    from lab.core import owner

    d = owner.claim_run(tmp_path / "seed=1")  # the job's run folder, as its first run made it
    nb = ["seed=1", f"run_dir={sw.quote(d)}"]
    from finished import mark_finished  # tests/finished.py

    for stage in ("01_explore",):
        atomic_write_json(d / stage / "metrics.json", {"n_train": 1})
        mark_finished(d / stage)
    key = sw.config_key(sw.job_config(nb))
    jobs.write_done(d, "seed=1", ["01_explore"], ["seed=1"], key, "now")
    assert jobs.is_done(d, ["01_explore"], ["seed=1"], key)
    changed = sw.config_key(sw.job_config([*nb, "sft.learning_rate=0.5"]))
    assert not jobs.is_done(d, ["01_explore"], ["seed=1"], changed)
    ran = []
    monkeypatch.setattr(sw, "execute_stage", lambda stage, job_dir, nbo, **kw: ran.append(stage) or atomic_write_json(
        job_dir / stage / "metrics.json", {}) and mark_finished(job_dir / stage))
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


# ---- evaluation without waves (lab.model.generate: vllm hands every prompt over at once) --------------------------

class _FakeEngine:
    """A stand-in for vLLM's LLMEngine (no vllm import): requests finish `per_step` at a time, the last added first,
    each with text derived from its prompt; `die_after` finished requests, step() raises (a kill)."""

    def __init__(self, per_step=2, die_after=None):
        self.added, self.steps, self.aborted, self.finished = [], 0, [], 0
        self.added_at_first_step = None
        self.per_step, self.die_after = per_step, die_after

    def add_request(self, request_id, prompt, params, lora_request=None):
        self.added.append((request_id, prompt, params))

    def has_unfinished_requests(self):
        return self.finished < len(self.added)

    def step(self):
        import types

        if self.added_at_first_step is None:
            self.added_at_first_step = len(self.added)
        self.steps += 1
        if self.die_after is not None and self.finished >= self.die_after:
            raise KeyboardInterrupt("killed")
        outs = []
        for rid, prompt, params in reversed(self.added[:len(self.added) - self.finished]):
            if len(outs) == self.per_step:
                break
            n = params.kw["n"]
            outs.append(types.SimpleNamespace(request_id=rid, finished=True, outputs=[
                types.SimpleNamespace(text=f"{len(prompt)} \\boxed{{XXXVIII}} {j}", token_ids=[1] * (3 + j),
                                      logprobs=None, finish_reason="stop") for j in range(n)]))
            self.finished += 1
        return outs

    def abort_request(self, ids):
        self.aborted += list(ids)


def _fake_vllm_generator(cfg, tok, engine, monkeypatch):
    """A Generator on the vllm back-end whose engine is `engine`, with a stand-in `vllm` module (nothing imported)."""
    import functools
    import enum
    import sys
    import types

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = SamplingParams
    sp = types.ModuleType("vllm.sampling_params")
    sp.RequestOutputKind = enum.Enum("RequestOutputKind", "CUMULATIVE DELTA FINAL_ONLY")
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sp)

    class LLM:
        llm_engine = engine

        def generate(self, *a, **k):
            raise AssertionError("sample_table must stream requests, not call LLM.generate")

    gen = object.__new__(G.Generator)
    gen.cfg, gen.backend, gen.tokenizer, gen.adapter, gen.in_memory = cfg, "vllm", tok, None, False
    gen.model, gen.lora, gen._workdir, gen.llm = None, None, None, LLM()
    gen._generate = functools.partial(G.generate_vllm, gen.llm, lora_request=None)
    return gen


FIVE = pd.DataFrame({"id": list("abcde"), "prompt": [PUZZLE + " " * i for i in range(5)], "answer": ["XXXVIII"] * 5})


def test_vllm_evaluation_hands_every_prompt_over_at_once_and_resumes_per_request(run, monkeypatch):
    """Every puzzle goes to the engine before its first step (one hand-over, no chunks of 64 waiting for their
    longest completion); each puzzle is in the cache as soon as its request finishes, so a run killed after 3 of 5
    keeps those 3, and the rerun hands over only the other 2 and ends with the table an uninterrupted run gives."""
    root, _, tok = run
    cfg = compose([f"run_dir={root}", "infer.max_tokens=4", "model.generation_backend=vllm"])
    spec = G.Sampling.competition(cfg, n=2, temperature=0.5)
    cache = root / "vllm_samples.jsonl"
    cache.unlink(missing_ok=True)
    (root / "vllm_whole.jsonl").unlink(missing_ok=True)

    whole = _FakeEngine()
    full = S.sample_table(_fake_vllm_generator(cfg, tok, whole, monkeypatch), FIVE, spec, progress=False, chunk=2,
                          cache=root / "vllm_whole.jsonl")
    assert whole.added_at_first_step == 5 and len(whole.added) == 5 and whole.steps == 3  # one hand-over, chunk=2 unused
    params = whole.added[0][2].kw
    assert params["n"] == 2 and params["seed"] == spec.seed and params["output_kind"].name == "FINAL_ONLY"
    assert len(full) == 10 and list(full["id"].unique()) == list("abcde")  # puzzle order, not finishing order

    killed = _FakeEngine(per_step=1, die_after=3)
    with pytest.raises(KeyboardInterrupt):
        S.sample_table(_fake_vllm_generator(cfg, tok, killed, monkeypatch), FIVE, spec, cache=cache, progress=False)
    kept = [json.loads(l) for l in cache.read_text().splitlines()[1:]]
    assert sorted({r["id"] for r in kept}) == ["c", "d", "e"] and len(kept) == 6  # the three that finished
    assert len(killed.aborted) == 2  # the two still running were aborted in the engine

    rest = _FakeEngine()
    again = S.sample_table(_fake_vllm_generator(cfg, tok, rest, monkeypatch), FIVE, spec, cache=cache, progress=False)
    assert len(rest.added) == 2 and rest.added_at_first_step == 2
    assert {p for _, p, _ in rest.added} == set(G.Generator.prompts(_fake_vllm_generator(cfg, tok, rest, monkeypatch),
                                                                     FIVE["prompt"][:2].tolist()))
    pd.testing.assert_frame_equal(again, full)
    done = _FakeEngine()  # every puzzle cached: nothing handed over (a whole hand-over of none, not a crash)
    pd.testing.assert_frame_equal(S.sample_table(_fake_vllm_generator(cfg, tok, done, monkeypatch), FIVE, spec,
                                                 cache=cache, progress=False), full)
    assert done.added == [] and done.steps == 0
    key = json.loads(cache.read_text().splitlines()[0])["key"]
    assert key["chunk"] == 0 and key["backend"] == "vllm"


def test_hf_generation_leaves_torchs_random_state_as_it_was(run):
    """generate_hf seeds each batch, inside a fork: what a caller draws next (02_sft's LoRA init after the base-model
    evaluation) is the same whether the evaluation was generated or read from the cache."""
    import torch

    root, model, tok = run
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    G.generate_hf(model, tok, ["a b", "c"], G.Sampling(max_tokens=2, n=2, temperature=1.0), progress=False)
    assert torch.equal(torch.rand(3), expected)


def test_sft_evaluates_the_base_model_through_the_cache(run, monkeypatch):
    """02_sft's evaluation before training goes through `lab.eval.greedy.evaluate` with its cache (it used to pass cached=False),
    and a second evaluation with the same key is copied, not generated."""
    from types import SimpleNamespace

    from lab.eval import greedy
    from lab.recipes import sft
    from lab.train import sft as sft_lib

    root, _, _ = run
    cfg = compose([f"run_dir={root}", "infer.max_tokens=4", "data.n_val=1"])
    seen = []

    class Stop(Exception):
        pass

    monkeypatch.setattr(greedy, "evaluate", lambda *a, **k: seen.append(k) or pd.DataFrame({"correct": [True]}))
    monkeypatch.setattr(sft_lib, "model_with_lora", lambda *a, **k: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        sft.sft(SimpleNamespace(cfg=cfg, path=lambda n: root / n))
    assert seen and seen[0].get("cached", True) is True
    monkeypatch.undo()

    made = []
    real = S.predictions
    monkeypatch.setattr(S, "predictions", lambda *a, **k: made.append(1) or real(*a, **k))
    stage = SimpleNamespace(cfg=cfg, path=lambda n: root / n)
    first = greedy.evaluate(cfg, FIVE[:2], None, root / "before_a.csv")
    second = greedy.evaluate(cfg, FIVE[:2], None, root / "before_b.csv")
    assert made == [1]
    pd.testing.assert_frame_equal(first, second)
