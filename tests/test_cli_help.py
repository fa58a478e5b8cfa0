"""Every command of `python -m lab` (the table in lab/__main__.py, and the subcommands of those that have them)
answers `--help` with exit 0 and its usage line, without importing torch, transformers or matplotlib (the imports that
made `memory --help` take seconds). One fresh interpreter runs them all: a heavy import shows up after the first
command that makes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from lab.__main__ import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
SUBCOMMANDS = {"puzzles": ("solve", "check", "audit", "generate"), "kaggle": ("build", "dataset", "plan")}
HEAVY = ("torch", "transformers", "matplotlib")

PROBE = r"""
import contextlib, io, json, sys
from lab.__main__ import main
out = {}
for argv in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    out[" ".join(argv)] = {"rc": rc, "text": buf.getvalue(), "heavy": sorted(m for m in %r if m in sys.modules)}
print(json.dumps(out))
""" % (HEAVY,)


def _help_all(argvs: list[list[str]]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_every_command_help_exits_0_with_usage_and_no_heavy_import():
    argvs = [[c, "--help"] for c in COMMANDS]
    argvs += [[c, s, "--help"] for c, subs in SUBCOMMANDS.items() for s in subs]
    got = _help_all(argvs)
    bad = {}
    for argv in argvs:
        key = " ".join(argv)
        r = got[key]
        prog = "python -m lab " + " ".join(argv[:-1])
        if r["rc"] != 0 or not r["text"].startswith(f"usage: {prog}"):
            bad[key] = f"rc={r['rc']}: {r['text'][:200]!r}"
        elif r["heavy"]:
            bad[key] = f"imports {r['heavy']}"
    assert not bad, bad
    assert set(SUBCOMMANDS) <= set(COMMANDS)


def test_help_texts_say_what_each_argument_is():
    """The arguments that printed no help now say what they are; estimate's and schema's help read on their own."""
    got = _help_all([["puzzles", "solve", "--help"], ["puzzles", "check", "--help"], ["puzzles", "generate", "--help"],
                     ["schema", "--help"], ["estimate", "--help"]])
    text = {k.split(" --help")[0]: " ".join(v["text"].split()) for k, v in got.items()}  # argparse wraps lines
    assert "puzzle CSV with a prompt column" in text["puzzles solve"] and "CSV to write" in text["puzzles solve"]
    assert "derivation: the search written out" in text["puzzles solve"]
    assert "a `puzzles solve` output CSV" in text["puzzles check"]
    assert "the category to generate" in text["puzzles generate"]
    assert "docstring" not in text["estimate"] and "--price-per-hour" in text["estimate"]
    assert "sft" in text["schema"] and "group" in text["schema"].lower()
