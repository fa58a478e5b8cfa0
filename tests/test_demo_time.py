"""`python -m lab demo` says how long it will take: the expected time from the stage budgets and a probe of this
machine, before the first stage (lab.runs.pipeline.expected_seconds); and it runs on the demo's budget, cut to fit
about 5 minutes on an idle 2-core machine."""

import lab.runs.pipeline as pipeline
from lab.core.config import compose
from lab.runs.pipeline import PROBE_REF_S, STAGES, cpu_seconds, demo_overrides, expected_seconds, probe, work_units

# The idle 2-core development machine's wall seconds per stage (RESULTS.md, "`make demo` measured idle"): the budget
# before the cut (the default with GRPO's steps 10, its screening samples 4 per prompt, voting's k 4) and the demo's
BEFORE = ["grpo.max_steps=10", "grpo.pass_rate_k=4", "vote.k=4"]
BEFORE_S = {"01_explore": 12, "02_sft": 139, "03_grpo": 86, "04_vote": 48, "05_errors": 10}
DEMO_S = {"01_explore": 11, "02_sft": 97, "03_grpo": 36, "04_vote": 32, "05_errors": 10}


def test_the_demo_is_the_default_recipe_with_less_work():
    smoke, demo, default = (compose(o) for o in (["experiment=smoke"], ["experiment=demo"], []))
    for stage in ("02_sft", "03_grpo", "04_vote"):
        assert work_units(stage, smoke) < work_units(stage, demo) < work_units(stage, default), stage
    for key in ("sft.learning_rate", "sft.epochs", "sft.batch_size", "sft.lr_scheduler_type", "grpo.learning_rate",
                "grpo.temperature", "grpo.num_generations", "grpo.prompts_per_step", "vote.temperature",
                "model.max_model_len", "model.architecture"):
        group, name = key.split(".")
        assert demo[group][name] == default[group][name], key  # counts are cut, the recipe is not


def test_the_expectation_reproduces_the_measured_demo_and_the_cut_demo_fits_about_five_minutes():
    at_ref = expected_seconds(compose(BEFORE), STAGES, PROBE_REF_S)
    demo = expected_seconds(compose(["experiment=demo"]), STAGES, PROBE_REF_S)
    for expected, measured in ((at_ref, BEFORE_S), (demo, DEMO_S)):
        assert all(abs(expected[s] - measured[s]) <= 0.05 * measured[s] + 0.5 for s in STAGES), (expected, measured)
    assert sum(demo.values()) < min(300, sum(at_ref.values()))  # within 5 minutes on that machine, and less work
    slower = expected_seconds(compose(["experiment=demo"]), STAGES, 2 * PROBE_REF_S)
    assert all(abs(slower[s] - 2 * demo[s]) < 1e-9 for s in STAGES)
    smoke = compose(["experiment=smoke"])
    assert sum(expected_seconds(smoke, STAGES, PROBE_REF_S).values()) < sum(demo.values())


def test_the_probe_and_the_cpu_clock():
    speed = probe(reps=3)
    assert 0 < speed < 1
    before = cpu_seconds()
    probe()
    assert cpu_seconds() > before


def test_a_busy_machine_is_named(monkeypatch):
    monkeypatch.setattr(pipeline.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(pipeline.os, "getloadavg", lambda: (0.3, 0.3, 0.3))
    assert pipeline._load_note() == ""
    monkeypatch.setattr(pipeline.os, "getloadavg", lambda: (6.5, 4.0, 2.0))
    assert "busy (load average 6.5 on 2 cores)" in pipeline._load_note()


def test_the_demo_runs_on_its_budget_unless_an_experiment_is_chosen():
    assert demo_overrides([]) == ["experiment=demo", "run_name=demo"]
    assert demo_overrides(["seed=7", "run_name=s7"]) == ["experiment=demo", "seed=7", "run_name=s7"]
    assert demo_overrides(["experiment=competition"]) == ["run_name=demo", "experiment=competition"]
    cfg = compose(demo_overrides(["grpo.max_steps=3"]))
    assert cfg.grpo.max_steps == 3 and cfg.vote.k == 4 and cfg.sft.epochs == 1  # the user's key wins
