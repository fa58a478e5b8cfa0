"""The submission check enforces the documented layout: exactly adapter_config.json and adapter_model.safetensors at
the zip's root, names exact, no symbolic-link members (case 12 of the fail-closed probe)."""

from __future__ import annotations

import json
import stat
import zipfile

import pytest

torch = pytest.importorskip("torch")

from safetensors.torch import save  # noqa: E402

from lab.model.submission_check import CONFIG_NAME, WEIGHTS_NAME, check  # noqa: E402

R = 4
TENSORS = {"base_model.model.model.layers.0.mixer.q_proj.lora_A.weight": torch.full((R, 16), 0.01),
           "base_model.model.model.layers.0.mixer.q_proj.lora_B.weight": torch.zeros(16, R)}
CONFIG = {"r": R, "lora_alpha": 8, "target_modules": ["q_proj"], "peft_type": "LORA"}


def _zip(path, extra: dict[str, bytes] = (), links: dict[str, str] = ()) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(CONFIG_NAME, json.dumps(CONFIG))
        zf.writestr(WEIGHTS_NAME, save(TENSORS))
        for name, data in dict(extra).items():
            zf.writestr(name, data)
        for name, target in dict(links).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16  # what `zip --symlinks` writes
            zf.writestr(info, target)
    return str(path)


def test_the_two_files_alone_are_valid(tmp_path):
    assert check(_zip(tmp_path / "ok.zip")) == []  # the control: only the layout differs below


@pytest.mark.parametrize("extra,words", [
    ({"evil.sh": b"rm -rf ~\n"}, "other members beside adapter_config.json and adapter_model.safetensors: evil.sh"),
    ({"ADAPTER_CONFIG.JSON": json.dumps(CONFIG).encode()}, "ADAPTER_CONFIG.JSON: names are exact, case included"),
    ({"README.md": b"notes"}, "the zip must hold exactly those two files"),
])
def test_another_member_is_a_problem(tmp_path, extra, words):
    problems = check(_zip(tmp_path / "z.zip", extra))
    assert any(words in p for p in problems), problems


def test_a_symbolic_link_member_is_a_problem(tmp_path):
    problems = check(_zip(tmp_path / "z.zip", links={"etc": "/etc"}))
    assert any("symbolic-link member(s) etc" in p for p in problems), problems
