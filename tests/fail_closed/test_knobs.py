"""Free-form knobs are validated against what their consumer accepts (case 13 of the fail-closed probe), and a number
that is not finite is refused at compose."""

from __future__ import annotations

import pytest

from lab import LabError
from lab.core.config import compose


def test_a_misspelt_difficulty_knob_is_refused_before_anything_runs(tmp_path):
    """Case 13: `data.difficulty={numeral_system:{max_vlaue:3999}}` was recorded and ignored (generators took **_)."""
    from lab.data.dataset import check_data_settings
    from lab.runs.pipeline import run_notebooks

    cfg = compose([f"run_dir={tmp_path / 'run'}", "data.difficulty={numeral_system: {max_vlaue: 3999}}"])
    with pytest.raises(LabError, match=r"data\.difficulty\.numeral_system\.max_vlaue: not a difficulty knob of "
                                       r"numeral_system \(its knobs: max_value, n_examples\)"):
        check_data_settings(cfg)
    with pytest.raises(LabError, match="max_vlaue"):  # the demo's driver refuses it before any stage folder
        run_notebooks([f"run_dir={tmp_path / 'run'}", "data.difficulty={numeral_system: {max_vlaue: 3999}}"])
    assert not (tmp_path / "run").exists()
    check_data_settings(compose(["data.difficulty={numeral_system: {max_value: 3999}}"]))  # the right key: accepted
    with pytest.raises(LabError, match="data.difficulty.*'gravty' is not a category"):
        check_data_settings(compose(["data.difficulty={gravty: {n_examples: 3}}"]))


def test_puzzles_generate_refuses_an_unknown_set_knob(tmp_path, capsys):
    """Case 13: `puzzles generate --set foo=3` wrote puzzles, the knob ignored."""
    from lab.puzzles.cli import main
    from lab.puzzles.generate import generate

    out = tmp_path / "g.csv"
    assert main(["generate", "--category", "gravity", "--n", "2", "--set", "foo=3", str(out)]) == 2
    assert "--set foo: not a difficulty knob of gravity (its knobs: n_examples, g_min, g_max, t_max)" in \
        capsys.readouterr().err and not out.exists()
    with pytest.raises(ValueError, match="not a difficulty knob"):
        generate("gravity", 1, 0, foo=3)
    assert main(["generate", "--category", "gravity", "--n", "2", "--set", "t_max=3", str(out)]) == 0  # control


@pytest.mark.parametrize("override", ["sft.learning_rate=inf", "sft.learning_rate=nan", "grpo.temperature=-inf",
                                      "+grpo.rewards.length=inf"])
def test_non_finite_numbers_are_refused_at_compose(override):
    """Low item: `sft.learning_rate=inf` was accepted (it trained, then pack failed on NaN weights)."""
    with pytest.raises(LabError, match="must be a finite number"):
        compose([override])
