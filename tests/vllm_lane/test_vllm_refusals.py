"""What must never be served: the raw PEFT folder is refused by vLLM itself; a packed adapter with an expert's
tensor missing, a rank above max_lora_rank, DoRA, or targets that match nothing are refused by
`lab.model.submission.check` before any engine starts (the lab's own vLLM path, `Generator`, runs that check), with a
message naming the problem. What vLLM does with each of those zips on its own is recorded beside it."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch
from lane_report import REFUSAL_ROWS
from safetensors.torch import load as st_load, save as st_save
from test_vllm_parity import FAMILIES, SCALE, make_adapter

from lab import LabError


@pytest.fixture(scope="module")
def adapter(lane):
    """A random adapter on every family (raw PEFT folder) and its packed zip."""
    from lab.model import submission

    folder = make_adapter(lane, "refusals", FAMILIES["every family"], SCALE, seed=11)
    return folder, submission.pack(folder, lane["root"] / "refusals.zip")


@pytest.fixture(scope="module")
def engine(lane):
    from lab.model import generate

    llm = generate.vllm_engine(lane["cfg"], lane["base"])
    yield llm
    llm.llm_engine.engine_core.shutdown()


_IDS = iter(range(100, 10_000))


def vllm_reaction(lane, engine, folder) -> str:
    """What vLLM itself does when asked to serve `folder`: its error, or whether the output changed."""
    from vllm.lora.request import LoRARequest

    from lab.model.generate import Sampling, generate_vllm

    req = LoRARequest(lora_name=folder.name, lora_int_id=next(_IDS), lora_path=str(folder))
    try:
        with_lora = generate_vllm(engine, lane["prompts"][:4], Sampling(max_tokens=8), lora_request=req)
    except Exception as e:  # noqa: BLE001  (recording vLLM's own reaction, whatever it is)
        return f"vLLM refuses it: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
    base = generate_vllm(engine, lane["prompts"][:4], Sampling(max_tokens=8))
    same = sum(a[0].token_ids == b[0].token_ids for a, b in zip(with_lora, base))
    return f"vLLM loads it and serves it ({same} of 4 outputs equal the base model's)"


def edited(lane, packed, name, config_edit=None, tensors_edit=None):
    from lab.model.submission import CONFIG_NAME, WEIGHTS_NAME

    with zipfile.ZipFile(packed) as z:
        config, tensors = json.loads(z.read(CONFIG_NAME)), st_load(z.read(WEIGHTS_NAME))
    if config_edit:
        config_edit(config)
    if tensors_edit:
        tensors_edit(tensors)
    out = lane["root"] / f"{name}.zip"
    with zipfile.ZipFile(out, "w") as z:
        z.writestr(CONFIG_NAME, json.dumps(config))
        z.writestr(WEIGHTS_NAME, st_save(tensors))
    folder = lane["root"] / name
    with zipfile.ZipFile(out) as z:
        z.extractall(folder)
    return out, folder


def test_raw_peft_folder_is_refused_by_vllm(lane, engine, adapter):
    folder, _ = adapter
    msg = vllm_reaction(lane, engine, folder)
    REFUSAL_ROWS.append({"case": "raw PEFT folder (fused expert keys)", "by": "vLLM", "message": msg})
    assert msg.startswith("vLLM refuses it") and "3D" in msg, msg


def _drop_expert(t):
    del t[next(k for k in sorted(t) if ".experts.1.up_proj.lora_A" in k)]


def _to_rank_64(config):
    config["r"] = 64


def _pad_rank_64(t):
    for k in list(t):
        if "lora_A" in k:
            t[k] = torch.cat([t[k], torch.zeros(64 - t[k].shape[0], t[k].shape[1])])
        elif "lora_B" in k:
            t[k] = torch.cat([t[k], torch.zeros(t[k].shape[0], 64 - t[k].shape[1])], dim=1)


def _dora(config):
    config["use_dora"] = True


def _rename_to_gate_proj(t):
    for k in list(t):
        if ".q_proj." in k:
            t[k.replace(".q_proj.", ".gate_proj.")] = t.pop(k)


def _gate_proj_target(config):
    config["target_modules"] = ["gate_proj" if m == "q_proj" else m for m in config["target_modules"]]


CASES = {  # case -> (config edit, tensors edit, words check's message must contain)
    "one expert's tensor missing": (None, _drop_expert, ["missing", "experts.1.up_proj"]),
    "rank 64 > max_lora_rank 32": (_to_rank_64, _pad_rank_64, ["64", "32"]),
    "DoRA": (_dora, None, ["DoRA"]),
    "targets that match no module (gate_proj)": (_gate_proj_target, _rename_to_gate_proj, ["gate_proj", "match no"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_check_refuses_before_vllm(lane, engine, adapter, case):
    from lab.model import generate, submission

    config_edit, tensors_edit, words = CASES[case]
    _, packed = adapter
    bad, folder = edited(lane, packed, case.split()[0] + "_" + str(list(CASES).index(case)), config_edit,
                         tensors_edit)
    problems = submission.check(bad, base_model=lane["base"])
    assert problems, f"{case}: lab.model.submission.check accepted it"
    hit = [p for p in problems if all(w in p for w in words)]
    assert hit, f"{case}: no problem names it: {problems}"
    with pytest.raises(LabError) as e:  # the lab's vLLM path refuses it before starting an engine
        generate.Generator(lane["cfg"], adapter=bad)
    assert all(w in str(e.value) for w in words)
    REFUSAL_ROWS.append({"case": case, "by": "lab.model.submission.check", "message": hit[0]})
    REFUSAL_ROWS.append({"case": case, "by": "(vLLM alone, for the record)",
                         "message": vllm_reaction(lane, engine, folder)})
