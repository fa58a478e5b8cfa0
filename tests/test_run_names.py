"""Run names name a folder inside outputs/ (issue 28, item 7): refused when they leave it or are empty, before
anything is written; a non-ASCII name works when quoted and is otherwise refused in plain words."""

import pytest

from lab import LabError
from lab.core.config import compose
from lab.core.paths import resolve_path


@pytest.mark.parametrize("name", ["../escape", "", ".", "a/../..", "/tmp/escape"])
def test_a_run_name_that_leaves_outputs_or_is_empty_is_refused(name):
    with pytest.raises(LabError, match=r"run_name=.*(leaves outputs/|is empty).*nothing was run"):
        compose([f"run_name={name}"])


def test_a_plain_or_nested_run_name_stays_inside_outputs():
    assert compose(["run_name=my_run"]).run_dir == "outputs/my_run"
    assert compose(["run_name=group/one"]).run_dir == "outputs/group/one"
    assert compose(["run_dir=/tmp/elsewhere"]).run_dir == "/tmp/elsewhere"  # run_dir is the way out, on purpose


def test_a_non_ascii_run_name_works_quoted_and_is_refused_plainly_unquoted():
    cfg = compose(["run_name='été_1'"])
    assert cfg.run_dir == "outputs/été_1" and resolve_path(cfg.run_dir).parent == resolve_path("outputs")
    with pytest.raises(LabError) as e:
        compose(["run_name=été_1"])
    assert "quote it: run_name='été_1'" in str(e.value) and "Lexer" not in str(e.value)
