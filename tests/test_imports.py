"""lab/'s import structure. The rules are import-linter's contracts in pyproject.toml (`[tool.importlinter]`: the
layers, no import cycle, imports inside functions counted): `lint-imports` keeps them, and a planted upward import,
cycle or unlisted module breaks them (so the contracts are not vacuous). Every module also imports on its own, in
any order, in a fresh interpreter (nothing GPU-only or cyclic at import time).

import-linter comes with the dev extra (`pip install -e '.[dev]'`); without it the contract tests skip."""

from __future__ import annotations

import copy
import importlib.util
import json
import random
import subprocess
import sys

import pytest

from lab.core.paths import project_root

LAB = project_root() / "lab"
PYPROJECT = project_root() / "pyproject.toml"
MAX_MODULE_LEVELS = 9  # the longest chain of imports between lab's modules, in modules (scripts/import_graph.py)


def lab_modules() -> list[str]:
    names = []
    for p in sorted(LAB.rglob("*.py")):
        parts = p.relative_to(LAB.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_lint_imports_keeps_the_contracts(capsys, monkeypatch):
    pytest.importorskip("importlinter")
    from importlinter.cli import lint_imports

    monkeypatch.setattr(sys, "path", list(sys.path))  # lint_imports puts the working directory first
    code = lint_imports(config_filename=str(PYPROJECT), no_cache=True, no_logo=True)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "2 kept, 0 broken" in out, out


def _check(graph) -> dict[str, bool]:
    """contract id -> kept, for pyproject.toml's contracts on `graph` (what lint-imports does, on a graph we edit)."""
    from importlinter.api import read_configuration
    from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
    from importlinter.contracts.layers import LayersContract

    conf = read_configuration(str(PYPROJECT))
    kinds = {"layers": LayersContract, "acyclic_siblings": AcyclicSiblingsContract}
    kept = {}
    for options in conf["contracts_options"]:
        contract = kinds[options["type"]](options["name"], conf["session_options"], options)
        contract.validate()
        kept[options["id"]] = contract.check(copy.deepcopy(graph), verbose=False).kept
    return kept


@pytest.fixture(scope="module")
def graph():
    pytest.importorskip("importlinter")
    import grimp

    return grimp.build_graph("lab", cache_dir=None)


def test_the_package_itself_imports_nothing_of_the_lab(graph):
    """`lab/__init__.py` (LabError) sits under every layer: it imports no lab module."""
    assert graph.find_modules_directly_imported_by("lab") == set()


def test_the_contracts_hold_and_fail_on_a_planted_violation(graph):
    assert _check(graph) == {"layers": True, "acyclic": True}

    upward = copy.deepcopy(graph)  # the metric importing the command table (which imports lab.core only, so no
    upward.add_import(importer="lab.competition.metric", imported="lab.__main__", line_number=1,  # cycle): layers
                      line_contents="from lab.__main__ import COMMANDS")
    assert _check(upward) == {"layers": False, "acyclic": True}

    cycle = copy.deepcopy(graph)  # the metric must stand alone: the puzzles import it, so this closes a cycle too
    cycle.add_import(importer="lab.competition.metric", imported="lab.puzzles.solve", line_number=1,
                     line_contents="from lab.puzzles import solve")
    assert _check(cycle) == {"layers": False, "acyclic": False}

    same_layer = copy.deepcopy(graph)  # a cycle inside one layer: the layers allow it, the acyclic contract does not
    same_layer.add_import(importer="lab.model.lora", imported="lab.model.generate", line_number=1,
                          line_contents="from lab.model import generate")
    assert _check(same_layer) == {"layers": True, "acyclic": False}

    unlisted = copy.deepcopy(graph)  # a new module must be put in a layer (exhaustive)
    unlisted.add_module("lab.newthing")
    assert _check(unlisted)["layers"] is False


def _import_graph():
    """scripts/import_graph.py as a module: its `longest_chain` is what the test below holds."""
    spec = importlib.util.spec_from_file_location("import_graph", project_root() / "scripts" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_longest_import_chain_stays_within_nine_modules(graph):
    longest_chain = _import_graph().longest_chain
    longest = longest_chain(graph)
    assert len(longest) <= MAX_MODULE_LEVELS, f"{len(longest)} module levels: {' -> '.join(longest)}"

    on_top = copy.deepcopy(graph)  # a module importing the top of the longest chain makes it one longer
    on_top.add_import(importer="lab.planted", imported=longest[0], line_number=1, line_contents="import x")
    assert longest_chain(on_top) == ["lab.planted", *longest]

    tall = copy.deepcopy(graph)  # a planted chain one module past the limit is caught, whatever the lab's own depth
    names = [f"lab.planted{i}" for i in range(MAX_MODULE_LEVELS + 1)]
    for importer, imported in zip(names, names[1:]):
        tall.add_import(importer=importer, imported=imported, line_number=1, line_contents="import x")
    assert len(longest_chain(tall)) == MAX_MODULE_LEVELS + 1 > MAX_MODULE_LEVELS


@pytest.mark.slow  # several seconds: subprocesses or a full trace (the fast lane stays short)
@pytest.mark.parametrize("seed", [0, 1])
def test_every_module_imports_in_random_order_in_a_fresh_interpreter(seed):
    names = lab_modules()
    assert {"lab", "lab.core.config", "lab.model.lora", "lab.train.sft", "lab.puzzles", "lab.puzzles.solve"} <= set(names)
    random.Random(seed).shuffle(names)
    code = ("import importlib, json, sys\n"
            "for n in json.loads(sys.argv[1]):\n"
            "    importlib.import_module(n)\n")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(names)], cwd=project_root(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, f"order {names}:\n{out.stderr[-3000:]}"
