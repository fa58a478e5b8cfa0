"""The lab's import graph, package by package: levels (longest chain of imports below each package) and circles;
then module by module: the longest chain of imports (its length: the module levels, held <= 9 by
tests/test_imports.py).

    .venv/bin/python scripts/import_graph.py

grimp (import-linter's graph, imports inside functions included) builds the module graph; an edge between two
entries directly under lab/ is any import from a module of one into a module of the other. The layers contract in
pyproject.toml is what CI holds (`lint-imports`, tests/test_imports.py, which also holds `longest_chain` to at most
9 modules); this script counts and names the longest chain.
"""

from __future__ import annotations

import grimp


def top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "lab"


def longest_chain(g) -> list[str]:
    """The longest chain of imports between modules, importer first; its length is the module levels (a module's
    level: 1 + the highest level it imports). Ties go to the first in name order, so the answer is stable."""
    memo: dict[str, list[str]] = {}

    def chain(m: str, seen: frozenset = frozenset()) -> list[str]:
        if m in seen:
            raise SystemExit(f"circle through {m}")
        if m not in memo:
            below = [chain(d, seen | {m}) for d in sorted(g.find_modules_directly_imported_by(m))]
            memo[m] = [m, *max(below, key=len, default=[])]
        return memo[m]

    return max((chain(m) for m in sorted(g.modules)), key=len)


def module_levels(g) -> int:
    """The longest chain of imports between modules, counted in modules."""
    return len(longest_chain(g))


def main() -> None:
    g = grimp.build_graph("lab", cache_dir=None)
    edges: dict[str, set[str]] = {}
    for m in g.modules:
        for dep in g.find_modules_directly_imported_by(m):
            a, b = top(m), top(dep)
            if a != b and "lab" not in (a, b):
                edges.setdefault(a, set()).add(b)
    entries = sorted({top(m) for m in g.modules} - {"lab"})
    level: dict[str, int] = {}

    def depth(p: str, seen: tuple = ()) -> int:
        if p in seen:
            raise SystemExit(f"circle: {' -> '.join((*seen, p))}")
        if p not in level:
            level[p] = 1 + max((depth(q, (*seen, p)) for q in edges.get(p, ())), default=0)
        return level[p]

    for p in entries:
        depth(p)
    longest = longest_chain(g)
    print(f"{len(entries)} entries under lab/ (besides __init__.py), {max(level.values())} package levels, no circle; "
          f"{len(longest)} module levels")
    for p in sorted(entries, key=lambda p: (-level[p], p)):
        print(f"  level {level[p]:>2}  {p:<12} imports {', '.join(sorted(edges.get(p, ()))) or '-'}")
    print(f"the longest module chain ({len(longest)}): {' -> '.join(m.removeprefix('lab.') for m in longest)}")


if __name__ == "__main__":
    main()
