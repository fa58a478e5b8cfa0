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

from lab import config, models, sft, submission  # noqa: E402
from lab.config import LabError  # noqa: E402
from lab.submission import CONFIG_NAME, WEIGHTS_NAME, check, pack  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny LoRA adapter on every family (experts via target_parameters), non-zero weights.

    moe_intermediate_size=48 != hidden_size=64, so up_proj and down_proj have different shapes."""
    root = tmp_path_factory.mktemp("submission")
    cfg = config.compose([f"run_dir={root}", "model.architecture.moe_intermediate_size=48"])
    model, _ = models.load(cfg)
    pm, _ = sft.attach_lora(cfg, model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    adapter = sft.save_adapter(pm, root / "adapter")
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
    assert set(c) <= submission.LORA_CONFIG_FIELDS
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
            delta = w.get_delta_weight("default")  # (E, out, in), PEFT's own computation
            for e in range(E):
                key = f"base_model.model.model.layers.{li}.mixer.experts.{e}.{param}"
                A, B = t[f"{key}.lora_A.weight"], t[f"{key}.lora_B.weight"]
                assert tuple(A.shape) == ((r, H) if param == "up_proj" else (r, I))
                assert tuple(B.shape) == ((I, r) if param == "up_proj" else (H, r))
                torch.testing.assert_close(w.scaling["default"] * B @ A, delta[e], rtol=1e-5, atol=1e-6)
        assert f"base_model.model.model.layers.{li}.mixer.experts.{E}.up_proj.lora_A.weight" not in t


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
    for edit, msg in (({"use_dora": True}, "use_dora is true"), ({"r": 64}, "r=64 > 32"),
                      ({"rank_pattern": {"q_proj": 64}}, r"rank_pattern\['q_proj'\]=64")):
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
    _only(check(z), "LoRA rank r=64 is above 32")
    z = _variant(tmp_path, tiny, "rp64", config_edit=lambda c: c.update(rank_pattern={"q_proj": 64}))
    _only(check(z), "rank_pattern gives rank 64 to 'q_proj', above 32")


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

def test_cli_pack_and_check(tiny, tmp_path, capsys):
    out = tmp_path / "cli.zip"
    assert submission.main(["pack", str(tiny["adapter"]), str(out)]) == 0
    assert submission.main(["check", str(out), "--base-model", str(tiny["base"])]) == 0
    assert "valid" in capsys.readouterr().out
    bad = _variant(tmp_path, tiny, "cli_bad", config_edit=lambda c: c.update(r=64, use_dora=True))
    assert submission.main(["check", str(bad)]) == 1
    printed = capsys.readouterr().out
    assert "r=64 is above 32" in printed and "use_dora is true" in printed
    res = subprocess.run([sys.executable, "-m", "lab.submission", "check", str(bad)], capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 1 and "use_dora is true" in res.stdout
    assert submission.main(["check", str(tmp_path / "missing.zip")]) == 1


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
