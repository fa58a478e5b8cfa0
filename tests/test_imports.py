"""Every `lab` module imports on its own, in any order, in a fresh interpreter (no import cycle at import time), and
the module-level imports inside `lab/` form no cycle."""

from __future__ import annotations

import ast
import json
import random
import subprocess
import sys

import pytest

from lab.paths import project_root

LAB = project_root() / "lab"


def lab_modules() -> list[str]:
    names = []
    for p in sorted(LAB.rglob("*.py")):
        parts = p.relative_to(LAB.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def module_level_imports(name: str, modules: set[str], inside_functions: bool = False) -> set[str]:
    """The `lab` modules `name` imports at module level (also inside functions with `inside_functions`)."""
    path = LAB.parent.joinpath(*name.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    tree = ast.parse(path.read_text())
    for node in (ast.walk(tree) if inside_functions else tree.body):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in modules and t != name}
    return out


def test_the_module_list_is_complete():
    names = lab_modules()
    assert {"lab", "lab.config", "lab.lora", "lab.callbacks", "lab.sft", "lab.puzzles"} <= set(names)


@pytest.mark.slow  # several seconds: subprocesses or a full trace (the fast lane stays short)
@pytest.mark.parametrize("seed", [0, 1])
def test_every_module_imports_in_random_order_in_a_fresh_interpreter(seed):
    names = lab_modules()
    random.Random(seed).shuffle(names)
    code = ("import importlib, json, sys\n"
            "for n in json.loads(sys.argv[1]):\n"
            "    importlib.import_module(n)\n")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(names)], cwd=project_root(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, f"order {names}:\n{out.stderr[-3000:]}"


def test_module_level_imports_have_no_cycle():
    modules = set(lab_modules())
    graph = {n: module_level_imports(n, modules) for n in modules}
    assert graph["lab.sft"] >= {"lab.lora"} and "lab.sft" not in graph["lab.lora"]
    assert _find_cycle(graph) is None, "import cycle: " + " -> ".join(_find_cycle(graph))


def _find_cycle(graph):
    state: dict[str, int] = {}

    def visit(n, path):
        if state.get(n) == 1:
            return path[path.index(n):] + [n]
        if state.get(n) == 2:
            return None
        state[n] = 1
        for d in sorted(graph[n]):
            if (c := visit(d, path + [n])):
                return c
        state[n] = 2
        return None

    for n in sorted(graph):
        if (c := visit(n, [])):
            return c
    return None


def test_imports_inside_functions_close_no_cycle_either():
    """With the imports inside functions counted too, the graph has no cycle: a lazy import is for a heavy or
    optional package, never a way round a cycle (break one by moving the piece both modules need into the lower)."""
    modules = set(lab_modules())
    every = {n: module_level_imports(n, modules, inside_functions=True) for n in modules}
    assert _find_cycle(every) is None, "import cycle through imports inside functions: " + " -> ".join(_find_cycle(every))
    assert "lab.metric" in every["lab.puzzles.solve"]  # solve_frame scores with the metric itself, no fallback
    assert not any(n.startswith("lab.puzzles") for n in every["lab.metric"])  # the metric stands alone


def test_find_cycle_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert _find_cycle(graph) == ["a", "b", "c", "a"]
