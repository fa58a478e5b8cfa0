"""Exactly the configured LoRA families, on the tiny model (issue 26, item 10): PEFT's default Nemotron-H targets are
never added, and `check_table` refuses a family nobody asked for."""

from __future__ import annotations

import os

import pandas as pd
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

from lab.core import config  # noqa: E402
from lab.model import lora, models
from lab import LabError  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("lora_targets")


def compose(root, targets):
    return config.compose([f"run_dir={root / 'run'}", f"model.path={root / 'base_model'}",
                           f"sft.lora.targets=[{','.join(targets)}]"])


@pytest.mark.parametrize("targets", [["experts"], ["experts", "in_proj"], ["lm_head"], ["shared_experts.up_proj"],
                                     ["q_proj", "experts", "lm_head"]])
def test_the_adapter_holds_exactly_the_families_asked_for(root, targets):
    cfg = compose(root, targets)
    model, _ = models.load(cfg)
    pm, table = lora.attach_lora(cfg, model)
    assert sorted(table["family"]) == sorted(targets)
    got = {lora.family_of(n) for n, p in pm.named_parameters() if p.requires_grad}
    assert got == set(targets)  # in particular no q/k/v/o_proj that PEFT adds for target_modules=None


def test_peft_would_add_its_default_targets_for_target_modules_none(root):
    """Why lora_config never passes None (peft/utils/constants.py: nemotron_h -> q/k/v/o_proj)."""
    from peft import LoraConfig, get_peft_model

    model, _ = models.load(compose(root, ["experts"]))
    pm = get_peft_model(model, LoraConfig(r=4, target_modules=None, target_parameters=["mixer.experts.up_proj"]))
    assert {"experts", "q_proj", "k_proj", "v_proj", "o_proj"} <= set(lora.target_table(pm)["family"])


def test_check_table_refuses_a_family_not_asked_for(root):
    cfg = compose(root, ["experts"])
    table = pd.DataFrame({"family": ["experts", "q_proj"], "modules": [4, 2], "trainable_params": [100, 10]})
    with pytest.raises(LabError, match=r"families not in sft.lora.targets: q_proj"):
        lora.check_table(cfg, table)
    with pytest.raises(LabError, match=r"without trainable LoRA parameters: experts"):
        lora.check_table(cfg, table.assign(trainable_params=[0, 0]))
    lora.check_table(cfg, table.iloc[:1])  # exactly the configured family: fine
