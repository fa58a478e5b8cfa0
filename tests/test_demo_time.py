"""`python -m lab demo` says how long it will take: the expected time from the stage budgets and a probe of this
machine, before the first stage (lab.runs.pipeline.expected_seconds); and it runs on the demo's budget."""

from lab.core.config import compose
from lab.runs.pipeline import (FIXED_CPU_S, PROBE_CPU_S, STAGES, cpu_seconds, demo_overrides, expected_seconds,
                               probe, work_units)


def test_the_expectation_follows_the_budgets_and_the_probe():
    smoke, demo, default = (compose(o) for o in (["experiment=smoke"], ["experiment=demo"], []))
    for stage in ("02_sft", "03_grpo", "04_vote"):
        assert work_units(stage, smoke) < work_units(stage, demo) <= work_units(stage, default), stage
    assert work_units("03_grpo", demo) < work_units("03_grpo", default)  # GRPO and voting are shortened
    assert work_units("02_sft", demo) == work_units("02_sft", default)  # SFT is not
    at_ref = expected_seconds(demo, STAGES, PROBE_CPU_S)
    assert all(at_ref[s] >= FIXED_CPU_S[s] for s in STAGES)
    slower = expected_seconds(demo, STAGES, 2 * PROBE_CPU_S)
    assert all(abs(slower[s] - 2 * at_ref[s]) < 1e-9 for s in STAGES)
    assert sum(expected_seconds(smoke, STAGES, PROBE_CPU_S).values()) < sum(at_ref.values())


def test_the_probe_and_the_cpu_clock():
    cpu, wall = probe(reps=1)
    assert 0 < cpu and 0 < wall < 30
    before = cpu_seconds()
    probe(reps=1)
    assert cpu_seconds() > before


def test_the_demo_runs_on_its_budget_unless_an_experiment_is_chosen():
    assert demo_overrides([]) == ["experiment=demo", "run_name=demo"]
    assert demo_overrides(["seed=7", "run_name=s7"]) == ["experiment=demo", "seed=7", "run_name=s7"]
    assert demo_overrides(["experiment=competition"]) == ["run_name=demo", "experiment=competition"]
    cfg = compose(demo_overrides(["grpo.max_steps=3"]))
    assert cfg.grpo.max_steps == 3 and cfg.vote.k == 4 and cfg.sft.epochs == 1  # the user's key wins
