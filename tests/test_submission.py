"""submission.zip: pack a tiny adapter, check good and bad zips, the per-expert split against PEFT."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

from safetensors.torch import load as st_load, save as st_save  # noqa: E402

from lab.core import config  # noqa: E402
from lab.__main__ import main as lab_main
from lab.model import lora, models, submission, submission_check
from lab.core import paths
from lab import LabError  # noqa: E402
from lab.model.submission import CONFIG_NAME, WEIGHTS_NAME, check, pack  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny LoRA adapter on every family (experts via target_parameters), non-zero weights.

    moe_intermediate_size=48 != hidden_size=64, so up_proj and down_proj have different shapes."""
    root = tmp_path_factory.mktemp("submission")
    cfg = config.compose([f"run_dir={root}", "model.architecture.moe_intermediate_size=48"])
    model, _ = models.load(cfg)
    pm, _ = lora.attach_lora(cfg, model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    adapter = lora.save_adapter(pm, root / "adapter")
    out = pack(adapter, root / "submission.zip")
    return {"root": root, "cfg": cfg, "pm": pm, "adapter": adapter, "zip": out, "base": root / "base_model"}


def _first(tiny, attr) -> int:
    """Index of the first tiny layer whose mixer has `attr` (the layout may change)."""
    return next(i for i, layer in enumerate(tiny["pm"].base_model.model.model.layers) if hasattr(layer.mixer, attr))


def _files(zip_path) -> dict[str, bytes]:
    with zipfile.ZipFile(zip_path) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _zip(path, files: dict[str, bytes]):
    with zipfile.ZipFile(path, "w") as zf:
        for n, b in files.items():
            zf.writestr(n, b)
    return path


def _variant(tmp_path, tiny, name, config_edit=None, tensors_edit=None, files_edit=None):
    files = _files(tiny["zip"])
    if config_edit:
        c = json.loads(files[CONFIG_NAME])
        config_edit(c)
        files[CONFIG_NAME] = json.dumps(c).encode()
    if tensors_edit:
        t = st_load(files[WEIGHTS_NAME])
        tensors_edit(t)
        files[WEIGHTS_NAME] = st_save(t)
    if files_edit:
        files = files_edit(files)
    return _zip(tmp_path / f"{name}.zip", files)


# ---- pack ------------------------------------------------------------------------------------------

def test_pack_writes_exactly_the_two_files_at_the_root_and_is_valid(tiny):
    with zipfile.ZipFile(tiny["zip"]) as zf:
        assert sorted(zf.namelist()) == [CONFIG_NAME, WEIGHTS_NAME]
        assert all("/" not in i.filename and not i.is_dir() for i in zf.infolist())
    assert check(tiny["zip"]) == []
    assert check(tiny["zip"], base_model=tiny["base"]) == []
    files = _files(tiny["zip"])
    c = json.loads(files[CONFIG_NAME])
    assert set(c) <= submission_check.lora_config_fields()
    assert c["r"] == 32 and not c["use_dora"] and c["target_parameters"] is None
    assert {"up_proj", "down_proj", "out_proj", "q_proj"} <= set(c["target_modules"])
    t = st_load(files[WEIGHTS_NAME])
    assert not any(submission._FUSED.match(k) for k in t)
    assert all(k.startswith("base_model.model.") and k.endswith((".lora_A.weight", ".lora_B.weight")) for k in t)
    # no stray temporary files next to the zip (written atomically)
    assert [p.name for p in tiny["zip"].parent.glob(".submission.zip*")] == []


def test_per_expert_split_reproduces_peft_expert_deltas(tiny):
    t = st_load(_files(tiny["zip"])[WEIGHTS_NAME])
    arch = tiny["pm"].get_base_model().config
    E, H, I, r = arch.n_routed_experts, arch.hidden_size, arch.moe_intermediate_size, 32
    layers = tiny["pm"].base_model.model.model.layers
    moe = [i for i, layer in enumerate(layers) if hasattr(layer.mixer, "experts")]
    assert len(moe) >= 2
    for li in moe:
        outer = layers[li].mixer.experts  # down_proj wraps up_proj
        wrappers = {"up_proj": outer.base_layer, "down_proj": outer}
        for param, w in wrappers.items():
            assert w.parameter_name == param
            delta = w.get_delta_weight("default").cpu()  # (E, out, in), PEFT's own; on the CPU
            for e in range(E):
                key = f"base_model.model.model.layers.{li}.mixer.experts.{e}.{param}"
                A, B = t[f"{key}.lora_A.weight"], t[f"{key}.lora_B.weight"]
                assert tuple(A.shape) == ((r, H) if param == "up_proj" else (r, I))
                assert tuple(B.shape) == ((I, r) if param == "up_proj" else (H, r))
                torch.testing.assert_close(w.scaling["default"] * B @ A, delta[e], rtol=1e-5, atol=1e-6)
        assert f"base_model.model.model.layers.{li}.mixer.experts.{E}.up_proj.lora_A.weight" not in t


def test_the_same_adapter_packs_to_the_same_bytes(tiny, tmp_path, monkeypatch):
    """No time stamp of the moment of packing in the zip: a rerun's submission.zip is byte for byte the same."""
    import time

    first = pack(tiny["adapter"], tmp_path / "a.zip").read_bytes()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3 * 86400)  # days later, as zipfile reads the clock
    monkeypatch.setattr(time, "localtime", lambda s=None: __import__("datetime").datetime(2031, 5, 6).timetuple())
    assert pack(tiny["adapter"], tmp_path / "b.zip").read_bytes() == first
    with zipfile.ZipFile(tmp_path / "b.zip") as zf:
        assert {i.date_time for i in zf.infolist()} == {submission.ZIP_TIME}


def test_pack_drops_unknown_fields_and_refuses_dora_and_rank_64(tiny, tmp_path):
    import shutil

    src = tmp_path / "a"
    shutil.copytree(tiny["adapter"], src)
    c = json.loads((src / CONFIG_NAME).read_text())
    (src / CONFIG_NAME).write_text(json.dumps({**c, "unsloth_fixed": True, "layer_types": ["x"]}))
    out = pack(src, tmp_path / "out.zip", dtype="bfloat16")
    packed = json.loads(_files(out)[CONFIG_NAME])
    assert "unsloth_fixed" not in packed and "layer_types" not in packed and check(out) == []
    assert all(v.dtype == torch.bfloat16 for v in st_load(_files(out)[WEIGHTS_NAME]).values())
    for edit, msg in (({"use_dora": True}, "use_dora is true"), ({"r": 64}, "r=64 must be <= 32"),
                      ({"rank_pattern": {"q_proj": 64}}, r"rank_pattern\['q_proj'\]=64 must be <= 32")):
        (src / CONFIG_NAME).write_text(json.dumps({**c, **edit}))
        with pytest.raises(LabError, match=msg):
            pack(src, tmp_path / "bad.zip")
        assert not (tmp_path / "bad.zip").exists()
    (src / WEIGHTS_NAME).unlink()
    with pytest.raises(LabError, match="no adapter_model.safetensors"):
        pack(src, tmp_path / "bad.zip")


# ---- check: each bad case with its own message ------------------------------------------------------

def _only(problems, needle):
    hits = [p for p in problems if needle in p]
    assert hits, f"{needle!r} not in {problems}"
    return hits


def test_check_rejects_rank_64(tiny, tmp_path):
    z = _variant(tmp_path, tiny, "r64", config_edit=lambda c: c.update(r=64))
    _only(check(z), "adapter_config.json: r=64 must be <= 32")
    z = _variant(tmp_path, tiny, "rp64", config_edit=lambda c: c.update(rank_pattern={"q_proj": 64}))
    _only(check(z), "rank_pattern['q_proj']=64 must be <= 32")


def test_check_rejects_missing_files(tiny, tmp_path):
    z = _variant(tmp_path, tiny, "no_w", files_edit=lambda f: {CONFIG_NAME: f[CONFIG_NAME]})
    assert check(z) == ["missing adapter_model.safetensors at the zip's root"]
    z = _variant(tmp_path, tiny, "no_c", files_edit=lambda f: {WEIGHTS_NAME: f[WEIGHTS_NAME]})
    assert check(z) == ["missing adapter_config.json at the zip's root"]


def test_check_rejects_nested_zip_and_subfolders(tiny, tmp_path):
    z = _zip(tmp_path / "nested.zip", {"submission.zip": tiny["zip"].read_bytes()})
    problems = check(z)
    _only(problems, "nested zip inside the zip: submission.zip")
    z = _variant(tmp_path, tiny, "folder", files_edit=lambda f: {f"adapter/{k}": v for k, v in f.items()})
    problems = check(z)
    _only(problems, "files in a subfolder: adapter/adapter_config.json")
    _only(problems, "missing adapter_config.json at the zip's root")


def test_check_rejects_dora(tiny, tmp_path):
    z = _variant(tmp_path, tiny, "dora", config_edit=lambda c: c.update(use_dora=True))
    assert check(z) == ["use_dora is true: vLLM cannot serve DoRA adapters"]


def test_check_rejects_unknown_backend_fields(tiny, tmp_path):
    z = _variant(tmp_path, tiny, "unknown", config_edit=lambda c: c.update(unsloth_version="2026.10", use_cce=True))
    (p,) = check(z)
    assert "unknown back-end fields" in p and "unsloth_version" in p and "use_cce" in p


def test_check_rejects_tensor_names_that_match_no_module(tiny, tmp_path):
    att = _first(tiny, "q_proj")

    def rename(t):
        k = f"base_model.model.model.layers.{att}.mixer.q_proj.lora_A.weight"
        t[k.replace(f"layers.{att}.", "layers.99.")] = t.pop(k)
        k2 = f"base_model.model.model.layers.{att}.mixer.q_proj.lora_B.weight"
        t[k2.replace("q_proj", "gate_proj")] = t[k2].clone()

    z = _variant(tmp_path, tiny, "names", tensors_edit=rename)
    for base in (tiny["base"], None):  # with --base-model, and with the adapter's own base config
        (hit,) = _only(check(z, base_model=base), "tensor names that match no module of the base model")
        assert "layers.99.mixer.q_proj" in hit and "gate_proj" in hit
    # no base config at all: checked against the Nemotron-H families
    z = _variant(tmp_path, tiny, "names_nobase", tensors_edit=rename,
                 config_edit=lambda c: c.update(base_model_name_or_path="/nonexistent"))
    (hit,) = _only(check(z), "match no module of the known Nemotron-H module families")
    assert "gate_proj" in hit


def test_check_rejects_shapes_that_disagree_with_the_rank(tiny, tmp_path):
    k = f"base_model.model.model.layers.{_first(tiny, 'in_proj')}.mixer.in_proj.lora_A.weight"

    def shrink(t):
        t[k] = t[k][:16].contiguous()

    z = _variant(tmp_path, tiny, "shape", tensors_edit=shrink)
    problems = check(z)
    _only(problems, f"tensor shape disagrees with the rank: {k} has shape (16, 64) but the rank is 32")
    z = _variant(tmp_path, tiny, "shape_nobase", tensors_edit=shrink,
                 config_edit=lambda c: c.update(base_model_name_or_path="/nonexistent"))
    _only(check(z), "has shape (16, 64) but the rank is 32")


def test_check_reports_a_one_dimensional_lora_weight_instead_of_crashing(tiny, tmp_path):
    k = f"base_model.model.model.layers.{_first(tiny, 'in_proj')}.mixer.in_proj.lora_B.weight"

    def flatten(t):
        t[k] = t[k].flatten().contiguous()

    problems = check(_variant(tmp_path, tiny, "flat", tensors_edit=flatten))  # an IndexError before
    (hit,) = _only(problems, "tensor shape disagrees with the rank")
    assert k in hit and "LoRA weights are 2-D" in hit


def test_check_reports_fused_expert_keys(tiny, tmp_path):
    raw = {CONFIG_NAME: (tiny["adapter"] / CONFIG_NAME).read_bytes(),
           WEIGHTS_NAME: (tiny["adapter"] / WEIGHTS_NAME).read_bytes()}
    z = _zip(tmp_path / "raw.zip", raw)
    (hit,) = _only(check(z), "vLLM cannot load fused expert LoRA keys")
    assert "mixer.experts.base_layer.lora_A.weight" in hit or "mixer.experts.lora_A.weight" in hit


def test_check_reports_incomplete_expert_sets(tiny, tmp_path):
    moe = _first(tiny, "experts")

    def drop(t):
        for ab in ("A", "B"):
            t.pop(f"base_model.model.model.layers.{moe}.mixer.experts.3.down_proj.lora_{ab}.weight")

    (hit,) = _only(check(_variant(tmp_path, tiny, "experts", tensors_edit=drop)), "vLLM needs a LoRA on both")
    assert f"layers.{moe}.mixer.experts" in hit and "3.down_proj" in hit


def test_check_reports_adapter_names_in_keys_and_non_lora_tensors(tiny, tmp_path):
    k = f"base_model.model.model.layers.{_first(tiny, 'q_proj')}.mixer.q_proj.lora_A.weight"

    def rename(t):
        t[k.replace("lora_A.weight", "lora_A.default.weight")] = t.pop(k)
        t["base_model.model.lm_head.weight"] = torch.zeros(2, 2)

    problems = check(_variant(tmp_path, tiny, "names2", tensors_edit=rename))
    (hit,) = _only(problems, "tensors that are not LoRA weights")
    assert "lora_A.default.weight" in hit and "lm_head.weight" in hit
    _only(problems, "LoRA pairs with a missing half")


# ---- CLI ----------------------------------------------------------------------------------------------

@pytest.mark.slow  # several seconds: subprocesses or a full trace (the fast lane stays short)
def test_cli_pack_and_check(tiny, tmp_path, capsys):
    out = tmp_path / "cli.zip"
    assert lab_main(["pack", str(tiny["adapter"]), str(out)]) == 0
    assert lab_main(["check", str(out), "--base-model", str(tiny["base"])]) == 0
    assert "valid" in capsys.readouterr().out
    bad = _variant(tmp_path, tiny, "cli_bad", config_edit=lambda c: c.update(r=64, use_dora=True))
    assert lab_main(["check", str(bad)]) == 1
    printed = capsys.readouterr().out
    assert "r=64 must be <= 32" in printed and "use_dora is true" in printed
    res = subprocess.run([sys.executable, "-m", "lab", "check", str(bad)], capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 1 and "use_dora is true" in res.stdout
    assert lab_main(["check", str(tmp_path / "missing.zip")]) == 1


def test_check_on_non_zip(tmp_path):
    p = tmp_path / "x.zip"
    p.write_bytes(b"not a zip")
    assert check(p) == [f"{p}: not a zip file"]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(CONFIG_NAME, "{not json")
        zf.writestr(WEIGHTS_NAME, b"\x00" * 4)
    p.write_bytes(buf.getvalue())
    problems = check(p)
    _only(problems, "adapter_config.json is not valid JSON")
    _only(problems, "adapter_model.safetensors is not a valid safetensors file")


# ---- issues 16 and 19: the whole file read, the config against the tensors, the base model -----------------

def _data_start(st: bytes) -> int:
    """Offset of the first tensor byte in a safetensors file."""
    return 8 + int.from_bytes(st[:8], "little")


def _lie(st: bytes) -> bytes:
    """A header whose first tensor claims twice its rows: the byte ranges disagree with dtype x shape."""
    head = json.loads(st[8:_data_start(st)])
    name = next(k for k in head if k != "__metadata__")
    head[name]["shape"] = [head[name]["shape"][0] * 2, head[name]["shape"][1]]
    hb = json.dumps(head).encode()
    return len(hb).to_bytes(8, "little") + hb + st[_data_start(st):]


@pytest.mark.parametrize("damage", [
    lambda st: st[:len(st) // 2],                    # truncated in the data
    lambda st: st[:_data_start(st) - 10],            # truncated in the header
    lambda st: st + b"\0" * 64,                      # bytes after the last tensor, which safetensors refuses
    _lie,
    lambda st: (10 ** 12).to_bytes(8, "little") + st[8:],  # an implausible header length
], ids=["half", "header_cut", "trailing", "shape_lie", "header_length"])
def test_check_rejects_a_truncated_or_corrupt_safetensors(tiny, tmp_path, damage):
    z = _variant(tmp_path, tiny, "bad", files_edit=lambda f: {**f, WEIGHTS_NAME: damage(f[WEIGHTS_NAME])})
    problems = check(z)
    (hit,) = _only(problems, "adapter_model.safetensors is not a valid safetensors file")
    assert "truncated, with bytes no tensor owns, or with a header that disagrees" in hit
    assert problems == [hit]  # nothing is read from a file that cannot be trusted: no tensor problems follow


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_check_rejects_nan_and_inf_weights(tiny, tmp_path, value):
    k = f"base_model.model.model.layers.{_first(tiny, 'q_proj')}.mixer.q_proj.lora_B.weight"

    def poison(t):
        t[k] = t[k].clone()
        t[k][3, 5] = value

    (hit,) = _only(check(_variant(tmp_path, tiny, "nan", tensors_edit=poison)), "NaN or infinite LoRA weights")
    assert k in hit and "(1 of" in hit


def test_check_detects_overwritten_bytes(tiny, tmp_path):
    import random

    rng = random.Random(0)

    def garble(f):  # random bytes over 4 KiB of tensor data, re-zipped (the zip's CRC then matches)
        st = bytearray(f[WEIGHTS_NAME])
        at = _data_start(st) + 1024
        st[at:at + 4096] = bytes(rng.getrandbits(8) for _ in range(4096))
        return {**f, WEIGHTS_NAME: bytes(st)}

    problems = check(_variant(tmp_path, tiny, "garbled", files_edit=garble))
    assert any("NaN or infinite" in p or "far too large" in p for p in problems), problems
    # bytes changed inside the zip itself: the member's CRC-32 no longer matches
    z = tmp_path / "crc.zip"
    raw = bytearray(tiny["zip"].read_bytes())
    at = raw.index(b"base_model.model.", raw.index(b"adapter_model.safetensors") + 30) + 40  # inside the header
    raw[at:at + 1] = b"X" if raw[at:at + 1] != b"X" else b"Y"
    z.write_bytes(bytes(raw))
    _only(check(z), "damaged zip")


def test_check_rejects_a_config_that_disagrees_with_the_tensors(tiny, tmp_path):
    def gate(c):  # the config names gate_proj (Nemotron-H has none) where the tensors are on q_proj
        c["target_modules"] = ["gate_proj" if t == "q_proj" else t for t in c["target_modules"]]

    problems = check(_variant(tmp_path, tiny, "gate", config_edit=gate))
    (hit,) = _only(problems, "does not describe the tensors")
    assert "mixer.q_proj" in hit
    (hit,) = _only(problems, "names targets that have no tensors")
    assert "'gate_proj' (target_modules)" in hit
    # the tensors of one family removed while the config still names it
    att = _first(tiny, "k_proj")
    no_k = _variant(tmp_path, tiny, "no_k", tensors_edit=lambda t: [t.pop(k) for k in list(t) if ".k_proj." in k])
    (hit,) = _only(check(no_k), "names targets that have no tensors")
    assert "'k_proj'" in hit and att >= 0


def test_check_rejects_a_base_model_that_is_not_nemotron_h(tiny, tmp_path):
    z = _variant(tmp_path, tiny, "llama",
                 config_edit=lambda c: c.update(base_model_name_or_path="meta-llama/Llama-3-8B"))
    (hit,) = _only(check(z), "'meta-llama/Llama-3-8B', which is not Nemotron-H")
    # a local base model folder of another type
    other = tmp_path / "llama"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    z = _variant(tmp_path, tiny, "llama_dir", config_edit=lambda c: c.update(base_model_name_or_path=str(other)))
    _only(check(z), "is 'llama', not Nemotron-H")
    _only(check(tiny["zip"], base_model=other), "is 'llama', not Nemotron-H")


def test_check_warns_when_the_base_model_cannot_be_checked(tiny, tmp_path, capsys):
    good = check(tiny["zip"])
    assert good == [] and good.warnings == []
    z = _variant(tmp_path, tiny, "uncached",
                 config_edit=lambda c: c.update(base_model_name_or_path="someone/nemotron-h-never-downloaded"))
    report = check(z)
    assert report == []  # vLLM never reads the field: a valid zip, but the user is told what was not checked
    (w,) = report.warnings
    assert "cannot be checked here" in w and "--base-model" in w
    assert "warning:" in capsys.readouterr().err


def _peft_adapter(tiny, tmp_path, name, **lora):
    """A PEFT adapter on a fresh copy of the tiny model, every LoRA weight non-zero, saved with PEFT's defaults."""
    from peft import LoraConfig, get_peft_model

    model, _ = models.load(tiny["cfg"])
    pm = get_peft_model(model, LoraConfig(lora_dropout=0.0, **lora))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    pm.save_pretrained(str(tmp_path / name))
    return pm, tmp_path / name


def test_rank_and_alpha_patterns_are_packed_and_accepted(tiny, tmp_path):
    pm, adapter = _peft_adapter(tiny, tmp_path, "patterns", r=16, lora_alpha=32,
                                target_modules=["q_proj", "v_proj"],
                                target_parameters=["mixer.experts.up_proj", "mixer.experts.down_proj"],
                                rank_pattern={"q_proj": 8, "experts.up_proj": 4}, alpha_pattern={"v_proj": 64})
    z = pack(adapter, tmp_path / "patterns.zip")
    assert check(z) == [] and check(z, base_model=tiny["base"]) == []
    c = json.loads(_files(z)[CONFIG_NAME])
    t = st_load(_files(z)[WEIGHTS_NAME])
    # every module's delta, with the rank and alpha vLLM 0.33 resolves from the packed config for the packed name
    # (PEFTHelper.get_rank_and_scaling), equals PEFT's own delta
    base = pm.base_model.model
    q = _first(tiny, "q_proj")
    for key, wrapper in ((f"model.layers.{q}.mixer.q_proj", base.model.layers[q].mixer.q_proj),
                         (f"model.layers.{q}.mixer.v_proj", base.model.layers[q].mixer.v_proj)):
        A, B = t[f"base_model.model.{key}.lora_A.weight"], t[f"base_model.model.{key}.lora_B.weight"]
        r, alpha = submission.rank_for(key, c), submission.alpha_for(key, c)
        assert A.shape[0] == r
        torch.testing.assert_close(alpha / r * B @ A, wrapper.get_delta_weight("default").cpu(), rtol=1e-5, atol=1e-6)
    moe = _first(tiny, "experts")
    outer = base.model.layers[moe].mixer.experts
    for param, w in (("up_proj", outer.base_layer), ("down_proj", outer)):
        delta = w.get_delta_weight("default").cpu()
        for e in range(delta.shape[0]):
            key = f"model.layers.{moe}.mixer.experts.{e}.{param}"
            A, B = t[f"base_model.model.{key}.lora_A.weight"], t[f"base_model.model.{key}.lora_B.weight"]
            r, alpha = submission.rank_for(key, c), submission.alpha_for(key, c)
            assert A.shape[0] == (4 if param == "up_proj" else 16) == r
            torch.testing.assert_close(alpha / r * B @ A, delta[e], rtol=1e-5, atol=1e-6)


def test_check_rejects_an_effective_rank_above_32_and_mixed_expert_ranks(tiny, tmp_path):
    z = _variant(tmp_path, tiny, "rp48", config_edit=lambda c: c.update(r=16, rank_pattern={"q_proj": 48}))
    _only(check(z), "rank_pattern['q_proj']=48 must be <= 32")
    moe = _first(tiny, "experts")
    key = f"base_model.model.model.layers.{moe}.mixer.experts.1.up_proj"

    def shrink(t):  # expert 1's up_proj at rank 8 while the others keep 32 (said so by rank_pattern)
        t[f"{key}.lora_A.weight"] = t[f"{key}.lora_A.weight"][:8].contiguous()
        t[f"{key}.lora_B.weight"] = t[f"{key}.lora_B.weight"][:, :8].contiguous()

    z = _variant(tmp_path, tiny, "mixed", tensors_edit=shrink,
                 config_edit=lambda c: c.update(rank_pattern={rf"layers\.{moe}\.mixer\.experts\.1\.up_proj": 8}))
    (hit,) = _only(check(z), "the routed experts have different LoRA ranks [8, 32]")
    assert f"layers.{moe}.mixer.experts.up_proj" in hit


def test_lm_head_lora_is_packed_in_vllm_names_and_accepted(tiny, tmp_path):
    pm, adapter = _peft_adapter(tiny, tmp_path, "lm_head", r=8, lora_alpha=16, target_modules=["q_proj", "lm_head"])
    saved = st_load((adapter / WEIGHTS_NAME).read_bytes())
    assert "base_model.model.lm_head.base_layer.weight" in saved  # PEFT's default copies the whole head
    z = pack(adapter, tmp_path / "lm_head.zip")
    assert check(z) == [] and check(z, base_model=tiny["base"]) == []
    t = st_load(_files(z)[WEIGHTS_NAME])
    head = pm.base_model.model.lm_head
    vocab, hidden = head.base_layer.weight.shape
    # vLLM 0.33: parse_fine_tuned_lora_name -> module "lm_head", NemotronHForCausalLM.lm_head, served by
    # LogitsProcessorWithLoRA; A is (r, hidden), B is (vocab, r); the base-layer copy is one vLLM skips
    assert tuple(t["base_model.model.lm_head.lora_A.weight"].shape) == (8, hidden)
    assert tuple(t["base_model.model.lm_head.lora_B.weight"].shape) == (vocab, 8)
    assert not any("base_layer" in k for k in t)
    assert "lm_head" in json.loads(_files(z)[CONFIG_NAME])["target_modules"]
    A, B = t["base_model.model.lm_head.lora_A.weight"], t["base_model.model.lm_head.lora_B.weight"]
    torch.testing.assert_close(16 / 8 * B @ A, head.get_delta_weight("default").cpu())
    # a zip that keeps the copy is loadable (vLLM skips it) but says so
    raw = _zip(tmp_path / "raw_head.zip", {CONFIG_NAME: (adapter / CONFIG_NAME).read_bytes(),
                                           WEIGHTS_NAME: (adapter / WEIGHTS_NAME).read_bytes()})
    report = check(raw, base_model=tiny["base"])
    assert any("lm_head.base_layer.weight" in w for w in report.warnings)


def test_pack_writes_a_relative_or_given_base_model_name(tiny, tmp_path):
    name = json.loads(_files(tiny["zip"])[CONFIG_NAME])["base_model_name_or_path"]
    assert not os.path.isabs(name)
    assert paths.resolve_path(name).resolve() == tiny["base"].resolve()
    out = pack(tiny["adapter"], tmp_path / "hub.zip", base_model_name="nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    assert json.loads(_files(out)[CONFIG_NAME])["base_model_name_or_path"] == \
        "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"


def test_pack_creates_the_zip_with_the_users_permissions(tiny, tmp_path):
    old = os.umask(0o022)
    try:
        out = pack(tiny["adapter"], tmp_path / "perm.zip")
    finally:
        os.umask(old)
    assert os.stat(out).st_mode & 0o777 == 0o644


def test_pack_gives_a_clear_error_on_a_corrupt_adapter(tiny, tmp_path):
    import shutil

    src = tmp_path / "corrupt"
    shutil.copytree(tiny["adapter"], src)
    w = src / WEIGHTS_NAME
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(LabError, match=f"{WEIGHTS_NAME}: not a readable safetensors file"):
        pack(src, tmp_path / "out.zip")
    assert not (tmp_path / "out.zip").exists()
    # readable, but NaN weights: named with the adapter folder, nothing written
    t = st_load((tiny["adapter"] / WEIGHTS_NAME).read_bytes())
    k = next(iter(t))
    t[k] = torch.full_like(t[k], float("nan"))
    w.write_bytes(st_save(t))
    with pytest.raises(LabError, match="cannot be packed") as e:
        pack(src, tmp_path / "out.zip")
    assert "NaN or infinite" in str(e.value) and not (tmp_path / "out.zip").exists()


def test_check_refuses_zip_bombs_and_zip_slip_paths(tiny, tmp_path):
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(CONFIG_NAME, _files(tiny["zip"])[CONFIG_NAME])
        with zf.open(WEIGHTS_NAME, "w", force_zip64=True) as f:
            for _ in range(80):
                f.write(b"\0" * (1 << 20))
    (hit,) = _only(check(bomb), "a zip bomb or not an adapter")
    assert "not unpacked" in hit
    z = _variant(tmp_path, tiny, "slip", files_edit=lambda f: {"../" + CONFIG_NAME: f[CONFIG_NAME], **f})
    (hit,) = _only(check(z), "files in a subfolder")
    assert "../adapter_config.json" in hit


REAL = paths.project_root().parent / "shared" / "tokenizer" / "nemotron-3-nano"  # never committed, never downloaded


@pytest.mark.skipif(not (REAL / "config.json").is_file(), reason="../shared/tokenizer/nemotron-3-nano absent")
def test_check_against_the_real_nemotron_3_nano_config(tmp_path):
    """A rank-2 LoRA in vLLM's names on one attention, one Mamba and one MoE layer (all 128 experts) and lm_head
    of the real model, checked against its config on the meta device; then lm_head at the wrong vocabulary size."""
    modules = submission_check._base_modules(REAL)
    pattern = json.loads((REAL / "config.json").read_text())["hybrid_override_pattern"]
    layers = {f"model.layers.{pattern.index(c)}." for c in "*ME"}
    g = torch.Generator().manual_seed(0)
    t = {}

    def add(name, in_f, out_f):
        t[f"base_model.model.{name}.lora_A.weight"] = torch.randn(2, in_f, generator=g) * 0.01
        t[f"base_model.model.{name}.lora_B.weight"] = torch.randn(out_f, 2, generator=g) * 0.01

    for name, (kind, *rest) in modules.items():
        if name == "lm_head" or any(name.startswith(p) for p in layers):
            if kind == "linear":
                add(name, *rest)
            else:
                for param, (n_experts, out_f, in_f) in rest[0].items():
                    for e in range(n_experts):
                        add(f"{name}.{e}.{param}", in_f, out_f)
    assert t["base_model.model.lm_head.lora_B.weight"].shape == (131072, 2)
    assert "base_model.model.model.layers.1.mixer.experts.127.down_proj.lora_A.weight" in t
    cfg = {"r": 2, "lora_alpha": 4, "peft_type": "LORA", "bias": "none",
           "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "out_proj", "up_proj", "down_proj",
                              "lm_head"], "base_model_name_or_path": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"}
    z = _zip(tmp_path / "real.zip", {CONFIG_NAME: json.dumps(cfg).encode(), WEIGHTS_NAME: st_save(t)})
    assert check(z, base_model=REAL) == []
    t["base_model.model.lm_head.lora_B.weight"] = t["base_model.model.lm_head.lora_B.weight"][:1000].contiguous()
    z = _zip(tmp_path / "real_bad.zip", {CONFIG_NAME: json.dumps(cfg).encode(), WEIGHTS_NAME: st_save(t)})
    _only(check(z, base_model=REAL),
          "lm_head.lora_B.weight has shape (1000, 2), the base model's lm_head needs (131072, 2)")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_value_check_reads_every_float_dtype(tiny, tmp_path, dtype):
    k = f"base_model.model.model.layers.{_first(tiny, 'in_proj')}.mixer.in_proj.lora_A.weight"

    def cast(value=None):
        def edit(t):
            for name in t:
                t[name] = t[name].to(dtype)
            if value is not None:
                t[k][1, 2] = value
        return edit

    assert check(_variant(tmp_path, tiny, "ok", tensors_edit=cast(-5000.0))) == []  # large but plausible
    for value, needle in ((float("-inf"), "NaN or infinite"), (float("nan"), "NaN or infinite"),
                          (-3e4, "far too large")):
        (hit,) = _only(check(_variant(tmp_path, tiny, "bad", tensors_edit=cast(value))), needle)
        assert k in hit


def test_check_rejects_weights_that_are_not_floating_point(tiny, tmp_path):
    k = f"base_model.model.model.layers.{_first(tiny, 'q_proj')}.mixer.q_proj.lora_A.weight"
    z = _variant(tmp_path, tiny, "int", tensors_edit=lambda t: t.update({k: t[k].to(torch.int32)}))
    (hit,) = _only(check(z), "tensors that are not floating point")
    assert f"{k} is I32" in hit


def test_check_reports_duplicate_and_unreadable_members(tiny, tmp_path):
    import warnings

    files = _files(tiny["zip"])
    dup = tmp_path / "dup.zip"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name, which is the point
        with zipfile.ZipFile(dup, "w") as zf:
            for n, b in files.items():
                zf.writestr(n, b)
            zf.writestr(CONFIG_NAME, files[CONFIG_NAME])
    _only(check(dup), "holds adapter_config.json more than once")
    enc = bytearray(tiny["zip"].read_bytes())  # mark every member encrypted (general purpose flag bit 0)
    for sig, off in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = enc.find(sig)
        while at >= 0:
            enc[at + off] |= 1
            at = enc.find(sig, at + 4)
    (tmp_path / "enc.zip").write_bytes(bytes(enc))
    _only(check(tmp_path / "enc.zip"), "a member cannot be read")
