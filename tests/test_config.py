"""Every config group composes; bad overrides and bad paths fail with messages naming the file; manifests hold no
secrets."""

import dataclasses
import json
from pathlib import Path

import pytest

from omegaconf import OmegaConf

from lab import LabError
from lab.core.config import compose
from lab.core.paths import project_root
from lab.core.run import Stage, stage_output

# every config group on disk (a folder of conf/) and every option of it: a new group or option is covered as it lands
GROUPS = {p.name: sorted(f.stem for f in p.glob("*.yaml")) for p in sorted((project_root() / "conf").iterdir())
          if p.is_dir()}


def test_conf_holds_hydra_groups_only():
    """conf/ holds Hydra groups only (the accelerate launch files live in scripts/accelerate/): each folder is a
    group of the composed config or a group that selects others (experiment)."""
    assert set(GROUPS) <= set(compose([])) | {"experiment"}, GROUPS


@pytest.mark.parametrize("group,option", [(g, o) for g, opts in GROUPS.items() for o in opts])
def test_every_option_of_every_group_composes(group, option, tmp_path):
    """Every option composes onto the schema and passes its checks (types, back-end names, ranges, cross-key
    rules, every field set)."""
    cfg = compose([f"{group}={option}", f"run_dir={tmp_path}"])
    assert cfg.seed is not None and (group == "experiment" or cfg[group] is not None)


def test_every_yaml_key_has_help_text():
    """TRL-style help text: every key a file in conf/ sets is a field of lab/core/schema.py with its help (the text the
    YAML comments held before the schema); keys inside a free-form map (model.architecture) are the map's."""
    import dataclasses

    from omegaconf import OmegaConf

    from lab.core.schema import GROUPS, Config

    def schema_field(key):
        cls, field = Config, None
        for part in key.split("."):
            if cls is None:  # inside a free-form map
                return field
            field = {f.name: f for f in dataclasses.fields(cls)}.get(part)
            if field is None:
                return None
            cls = field.default_factory if dataclasses.is_dataclass(field.default_factory) else None
        return field

    def keys(tree, prefix):
        for k, v in tree.items():
            yield f"{prefix}{k}"
            if isinstance(v, dict):
                yield from keys(v, f"{prefix}{k}.")

    missing = []
    for f in (project_root() / "conf").rglob("*.yaml"):
        tree = OmegaConf.to_container(OmegaConf.load(f))
        tree.pop("defaults", None)
        prefix = f"{f.parent.name}." if f.parent.name in GROUPS else ""
        missing += [f"{f.relative_to(project_root())}: {k}" for k in keys(tree, prefix)
                    if not (schema_field(k) and schema_field(k).metadata.get("help"))]
    assert not missing, "keys without help text in lab/core/schema.py:\n" + "\n".join(missing)


def test_evaluation_uses_the_competitions_scoring_settings_unless_overridden():
    from lab.core.schema import CompetitionLimits

    cfg = compose([])
    lim = OmegaConf.to_object(cfg.competition)
    assert lim == CompetitionLimits()  # the node is the dataclass's defaults, nothing in conf/ sets it
    scoring = {f.name for f in dataclasses.fields(CompetitionLimits)}
    assert {k: cfg.infer[k] for k in scoring} == dataclasses.asdict(lim)
    assert "n" not in cfg.infer  # one completion per puzzle is what every evaluation does; no key pretends to set it
    local = compose(["infer.max_tokens=64", "infer.temperature=0.5"])
    assert (local.infer.max_tokens, local.infer.temperature) == (64, 0.5) and local.competition == cfg.competition
    with pytest.raises(LabError, match="competition.max_lora_rank is fixed by the competition"):
        compose(["competition.max_lora_rank=64"])


def test_unknown_override_names_the_file_and_key():
    with pytest.raises(LabError) as e:
        compose(["sft.no_such_key=1"])
    assert "config.yaml" in str(e.value) and "no_such_key" in str(e.value)


def test_the_old_key_sft_stages_names_its_new_name(tmp_path, monkeypatch):
    """`sft.stages` was renamed `sft.phases`: an override, a `+` override, a user's group file or a saved config that
    still says it gets one sentence naming the new key, not "no such key"."""
    import shutil

    from lab.core import config
    from lab.core.config import load_saved

    for override in ("sft.stages=[drills,traces]", "+sft.stages=[drills,traces]"):
        with pytest.raises(LabError, match=r"sft\.stages is now called sft\.phases .*; write sft\.phases$"):
            compose([override])
    conf = tmp_path / "conf"
    shutil.copytree(config.config_dir(), conf)
    (conf / "sft" / "mine.yaml").write_text("defaults:\n  - default\n  - _self_\nstages: [drills, traces]\n")
    monkeypatch.setattr(config, "config_dir", lambda: conf)
    with pytest.raises(LabError, match=r"sft\.stages is now called sft\.phases"):
        compose(["sft=mine"])
    (conf / "sft" / "mine.yaml").write_text("defaults:\n  - default\n  - _self_\nphases: [drills, traces]\n")
    assert list(compose(["sft=mine"]).sft.phases) == ["drills", "traces"]  # the control: the new key composes
    saved = tmp_path / "config.yaml"
    saved.write_text("sft:\n  stages: [traces]\n")
    with pytest.raises(LabError, match=r"sft\.stages is now called sft\.phases"):
        load_saved(saved)
    with pytest.raises(LabError, match="sft.no_such_key: no such key"):  # any other unknown key keeps its message
        compose(["sft.no_such_key=1"])


def test_unknown_group_option_is_clear():
    with pytest.raises(LabError) as e:
        compose(["model=does_not_exist"])
    assert "does_not_exist" in str(e.value)


def test_missing_data_path_names_the_path(tmp_path):
    from lab.data.dataset import prepare

    with pytest.raises(LabError) as e:  # since issue 19 at compose time, before any stage folder is opened
        prepare(compose(["data=competition", f"data.path={tmp_path}/nope.csv", f"run_dir={tmp_path}/run"]))
    assert "nope.csv" in str(e.value)


def test_stage_writes_config_and_manifest_without_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("KAGGLE_KEY", "supersecret-kaggle")
    monkeypatch.setenv("HF_TOKEN", "hf_supersecret")
    st = Stage("99_test", [f"run_dir={tmp_path}"])
    assert json.loads((st.dir / "manifest.json").read_text())["status"] == "running"
    with pytest.raises(LabError):
        stage_output(st.cfg, "99_test")  # not finished yet: downstream stages must not trust it
    st.finish({"accuracy": 0.5})
    m = json.loads((st.dir / "manifest.json").read_text())
    assert m["status"] == "finished" and m["seed"] == st.cfg.seed and m["end_time"] and m["packages"]["torch"]
    assert {"git_commit", "hardware", "start_time", "wall_seconds"} <= set(m)
    assert isinstance(m["hardware"]["torch_threads"], int) and m["hardware"]["torch_threads"] >= 1
    text = "".join(p.read_text() for p in st.dir.iterdir() if p.is_file())
    assert "supersecret" not in text
    assert json.loads((st.dir / "metrics.json").read_text())["accuracy"] == 0.5
    assert stage_output(st.cfg, "99_test") == Path(st.dir)


def test_seed_is_pinned_and_drives_the_split(tmp_path):
    from lab.data.dataset import prepare

    a = prepare(compose([f"run_dir={tmp_path}/a", "data.n_train=5", "data.n_val=2"]))
    b = prepare(compose([f"run_dir={tmp_path}/b", "data.n_train=5", "data.n_val=2"]))
    c = prepare(compose([f"run_dir={tmp_path}/c", "data.n_train=5", "data.n_val=2", "seed=99"]))
    assert a[0].equals(b[0]) and not a[0]["prompt"].equals(c[0]["prompt"])


def test_changed_data_settings_in_one_run_dir_is_an_error(tmp_path):
    from lab.data.dataset import prepare

    prepare(compose([f"run_dir={tmp_path}", "data.n_train=5", "data.n_val=2"]))
    with pytest.raises(LabError) as e:
        prepare(compose([f"run_dir={tmp_path}", "data.n_train=6", "data.n_val=2"]))
    assert "split.json" in str(e.value)


def test_overrides_parameter_accepts_papermills_string_and_lists():
    from lab.core.config import parse_overrides

    assert parse_overrides('["seed=7", "run_name=seed7"]') == ["seed=7", "run_name=seed7"]  # papermill -p
    assert parse_overrides("[seed=7, run_name=seed7]") == ["seed=7", "run_name=seed7"]  # YAML
    assert parse_overrides(["seed=7"]) == ["seed=7"] and parse_overrides(("a=1",)) == ["a=1"]
    assert parse_overrides("") == [] and parse_overrides(None) == [] and parse_overrides("[]") == []
    for bad in ("seed=7", "{seed: 7}", "[seed=7", ["seed=7", 7]):
        with pytest.raises(LabError, match="overrides"):
            parse_overrides(bad)


def test_parsed_overrides_reads_the_same_forms_and_checks_the_grammar():
    """The sweep and the Kaggle kernels had their own `parse_overrides`: Hydra's grammar over `list(value)`, so the
    papermill string `'["seed=7"]'` was read one character at a time; the notebooks' `parse_overrides` read that
    string but never checked Hydra's grammar. `parsed_overrides` is the notebooks' reading, then the grammar."""
    from lab.core.config import parsed_overrides, parse_overrides

    for value in ('["seed=7", "sft.learning_rate=1e-3,3e-3"]', ["seed=7", "sft.learning_rate=1e-3,3e-3"]):
        parsed = parsed_overrides(value)
        assert [o.key_or_group for o in parsed] == ["seed", "sft.learning_rate"]
        assert not parsed[0].is_sweep_override() and parsed[1].is_sweep_override()
    assert parsed_overrides(None) == [] and parsed_overrides("") == []
    assert parse_overrides(["seed=[1"]) == ["seed=[1"]  # the list as it is: compose reports the grammar error
    with pytest.raises(LabError, match=r"cannot parse overrides \['seed=\[1'\]"):
        parsed_overrides(["seed=[1"])
    with pytest.raises(LabError, match="not a list"):
        parsed_overrides("seed=7")


def test_stage_reads_the_overrides_string(tmp_path):
    st = Stage("99_test", f'["run_dir={tmp_path}", "seed=7"]')
    assert st.cfg.seed == 7 and st.final == tmp_path / "99_test" and st.overrides == [f"run_dir={tmp_path}", "seed=7"]


def test_a_run_without_a_name_gets_its_own_time_stamped_folder(monkeypatch):
    import re
    import time

    from lab.core.config import names_run

    a = compose([])
    time.sleep(1.05)
    b = compose([])
    assert re.fullmatch(r"outputs/\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", a.run_dir) and a.run_dir != b.run_dir
    assert a.sft.adapter_dir == f"{a.run_dir}/02_sft/adapter"  # every path of the run follows its folder
    assert compose(["run_name=x"]).run_dir == "outputs/x"
    assert names_run(["seed=1", "run_name=x"]) and names_run(["++run_dir=/tmp/r"]) and not names_run(["seed=1"])
    monkeypatch.setenv("WORLD_SIZE", "2")  # several processes would each stamp their own folder
    with pytest.raises(LabError, match="run_name"):
        Stage("99_test", ["seed=1"])


def test_the_competitions_limits_have_one_home(tmp_path):
    """The LoRA rank limit is the `competition` node's, checked by one function (lab.core.schema.rank_problem) for the
    config (sft.lora.r, infer.max_lora_rank) and for a packed adapter's config; the real model's context length
    interpolates the node too."""
    from omegaconf import read_write

    from lab.core.config import validate
    from lab.core.schema import rank_problem
    from lab.model.submission_check import config_problems

    cfg = compose([f"run_dir={tmp_path}"])
    assert compose(["model=nemotron_nano"]).model.max_model_len == cfg.competition.max_model_len
    with read_write(cfg.competition):  # a competition that allowed rank 16 at most: the config checks follow it
        cfg.competition.max_lora_rank = 16
    with pytest.raises(LabError, match=r"sft.lora.r=32 must be <= 16.*infer.max_lora_rank=32 must be <= 16"):
        validate(cfg)
    adapter = {"r": 33, "lora_alpha": 16, "target_modules": ["q_proj"], "rank_pattern": {"q_proj": 0}}
    ranks = [rank_problem("r", 33), rank_problem("rank_pattern['q_proj']", 0)]
    assert config_problems(adapter) == [f"adapter_config.json: {why}" for why in ranks]
    assert rank_problem("r", 33).startswith("r=33 must be <= 32") and rank_problem("r", 32) is None


def test_every_problem_is_listed_in_one_error():
    with pytest.raises(LabError) as e:
        compose(["sft.grad_accum=0", "seed=-1", "vote.top_p=1.5", "gpu.experts_rank=64", "sft.max_steps=0"])
    for message in ("sft.grad_accum=0 must be >= 1", "seed=-1 must be >= 0", "vote.top_p=1.5 must be <= 1",
                    "gpu.experts_rank=64 must be <= sft.lora.r=32", "sft.max_steps=0 must be >= 1 (or -1"):
        assert message in str(e.value)
    assert "nothing was run or changed" in str(e.value)


def test_a_group_built_by_hand_checks_itself():
    """TRL's way: the dataclass refuses bad values when it is built, not only inside a composed config."""
    import dataclasses as dc

    from lab.core.schema import VoteConfig

    good = OmegaConf.to_object(compose([]).vote)
    assert dc.replace(good, k=3).k == 3
    with pytest.raises(LabError, match=r"vote.k=0 must be >= 1"):
        dc.replace(good, k=0)
    assert isinstance(good, VoteConfig)
