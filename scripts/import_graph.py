"""The lab's import graph, package by package: levels (longest chain of imports below each package) and circles.

    .venv/bin/python scripts/import_graph.py

grimp (import-linter's graph, imports inside functions included) builds the module graph; an edge between two
entries directly under lab/ is any import from a module of one into a module of the other. The layers contract in
pyproject.toml is what CI holds (`lint-imports`, tests/test_imports.py); this script only counts.
"""

from __future__ import annotations

import grimp


def top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "lab"


def module_levels(g) -> int:
    """The longest chain of imports between modules (a module's level: 1 + the highest level it imports)."""
    memo: dict[str, int] = {}

    def depth(m: str, seen: frozenset = frozenset()) -> int:
        if m in seen:
            raise SystemExit(f"circle through {m}")
        if m not in memo:
            memo[m] = 1 + max((depth(d, seen | {m}) for d in g.find_modules_directly_imported_by(m)), default=0)
        return memo[m]

    return max(depth(m) for m in g.modules)


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
    print(f"{len(entries)} entries under lab/ (besides __init__.py), {max(level.values())} package levels, no circle; "
          f"{module_levels(g)} module levels")
    for p in sorted(entries, key=lambda p: (-level[p], p)):
        print(f"  level {level[p]:>2}  {p:<12} imports {', '.join(sorted(edges.get(p, ()))) or '-'}")


if __name__ == "__main__":
    main()
