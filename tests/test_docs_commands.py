"""Every command of every fenced shell block of README.md and kaggle_kernel/README.md, run as a new user would: so
the quick starts cannot drift from the code.

Each page runs in a copy of the checkout (its git-tracked and new files, in a fresh git repository, with `.venv`
linked to the venv running the tests and the copy first on PYTHONPATH, as an editable install would have it), from a
shell whose PATH does not hold the venv: a page must activate it as it tells the reader to. Its blocks run in order
in one shell session, so what one block sets up (the venv, `export KAGGLE_USERNAME`) the next one has.

Stand-ins, only where the network or a GPU is needed (`STAND_INS`, applied to the command's text; `plan` lists them,
`python tests/test_docs_commands.py` prints the table):
- Kaggle: the `kaggle` CLI and `python -m lab kaggle run` run for real against tests/kaggle_standin.py (kaggle 2.2.5's
  KaggleApi with its network calls replaced; tests/standin_site/sitecustomize.py installs it), with a made-up key;
- `make X` is make's dry run (`make -n X`): the target exists and expands. Running it would install into this venv,
  or run the test suite from inside itself; `python -m lab demo` below runs what `make demo` runs;
- `--fetch-wheels` (4.5 GB from the package index) is left out: the dataset is built without the wheels;
- `pip install` and the real model's `python -m lab demo $RUN` (a GPU, the 60 GB model) are not run;
- the demo and the sweep run on the smoke budget (`experiment=smoke`, the tests' own pipeline run), the sweep's jobs
  through 02_sft (the stage its grid changes); they, papermill,
  the summary of their run and the real model's memory trace (minutes on a CPU) run in the slow lane only.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
DOCS = ("README.md", "kaggle_kernel/README.md")
SLOW, NOT_RUN = "slow", "not run"

# (pattern, replacement, lane, why): every rule whose pattern matches a command applies, in this order; replacement
# None: not run. `lane`: SLOW runs in the slow lane only.
STAND_INS = [
    (r"^pip install\b.*", None, NOT_RUN, "needs the package index and a GPU"),
    (r"^python -m lab demo \$RUN\b.*", None, NOT_RUN, "the real model (60 GB) on a GPU"),
    (r"\bmake (?=[a-z])", "make -n ", "", "make's dry run: the target exists and expands"),
    (r"^(python -m lab kaggle dataset\b.*?) --fetch-wheels\b", r"\1", "",
     "--fetch-wheels left out: it downloads 4.5 GB of wheels from the package index"),
    (r"^python -m lab kaggle run\b.*", r"\g<0> --poll-s 0.01", "",
     "Kaggle is the stand-in: its status checked every 0.01 s"),
    (r"^python -m lab (demo|sweep)\b.*", r"\g<0> experiment=smoke", SLOW, "on the smoke budget (experiment=smoke)"),
    (r"^python -m lab sweep\b.*", r"\g<0> --stages 01_explore", SLOW,
     "the grid's four jobs through 01_explore only (the command, the grid and its folders; the demos above run "
     "all five stages, tests/test_sweep.py a sweep's training)"),
    (r"^(papermill\b.* -p overrides '\[.*?)\]'", "\\1, \"experiment=smoke\"]'", SLOW,
     "on the smoke budget (experiment=smoke)"),
    (r"^python -m lab (summary|memory|kaggle plan)\b", r"\g<0>", SLOW,
     "as written (the summary reads the demo's run; the real model's memory trace and Kaggle plan take minutes)"),
]


def blocks(doc: str) -> list[tuple[int, str]]:
    """The fenced bash/sh/shell blocks of `doc`: (the line its first command is on, its text)."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1))
            for m in re.finditer(r"^```(?:bash|sh|shell)\n(.*?)^```", text, re.M | re.S)]


def _strip_comment(line: str) -> str:
    """`line` without a trailing `# comment` (a # outside quotes, after a space, or starting the line)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def commands(block: str) -> list[str]:
    """The block's commands: comments dropped, lines continued with a backslash joined."""
    out, pending = [], ""
    for line in block.splitlines():
        line = _strip_comment(line)
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        cmd = (pending + line.strip()).strip()
        pending = ""
        if cmd:
            out.append(re.sub(r"\s+", " ", cmd) if "'" not in cmd and '"' not in cmd else cmd)
    return out


def stand_in(cmd: str) -> tuple[str | None, str, list[str]]:
    """(what runs, or None; the lane: '', SLOW or NOT_RUN; why) for a command of the docs."""
    run, lane, why = cmd, "", []
    for pattern, repl, rule_lane, reason in STAND_INS:
        if run is not None and re.search(pattern, run):
            run = None if repl is None else re.sub(pattern, repl, run)
            lane = rule_lane if rule_lane else lane
            why.append(reason)
    return run, lane, why


def plan(doc: str) -> list[dict]:
    """Every command of `doc` with what the test runs in its place and why."""
    return [{"line": line, "command": c, "runs": r, "lane": lane, "why": "; ".join(why)}
            for line, block in blocks(doc) for c in commands(block) for r, lane, why in [stand_in(c)]]


@pytest.fixture
def sandbox(tmp_path):
    """A copy of the checkout to run the docs in, the venv linked in, and the environment of a new shell."""
    venv = Path(sys.prefix)
    if not (venv / "bin" / "activate").is_file():
        pytest.skip(f"{venv}: the tests do not run in a venv, which the docs activate")
    if importlib.util.find_spec("kaggle") is None:
        pytest.skip("kaggle==2.2.5 is not installed (make venv)")
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    box = tmp_path / "lab"
    for f in filter(None, listed):
        if (ROOT / f).is_file():
            (box / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, box / f)
    subprocess.run("git init -q && git add -A", shell=True, cwd=box, check=True)
    (box / ".venv").symlink_to(venv)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p).resolve() != (venv / "bin").resolve()]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "LAB_ROOT")}
    env.update(PATH=os.pathsep.join(path), HOME=str(tmp_path / "home"), PYTHONPATH=os.pathsep.join(
        [str(box), str(TESTS / "standin_site")]), KAGGLE_CONFIG_DIR=str(tmp_path / "kaggle_config"),
        KAGGLE_KEY="stand-in", LAB_KAGGLE_STANDIN=str(tmp_path / "kaggle_standin.json"),
        LAB_KAGGLE_STANDIN_POLLS="0")
    env.pop("KAGGLE_USERNAME", None)
    for d in ("home", "kaggle_config"):
        (tmp_path / d).mkdir()
    return box, env


def run_doc(doc: str, sandbox, slow: bool) -> list[dict]:
    """Run `doc`'s commands in order in one bash session in the sandbox (the slow ones only when `slow`)."""
    box, env = sandbox
    steps = plan(doc)
    script = ["set -euo pipefail"]
    for s in steps:
        if s["runs"] is None or (s["lane"] == SLOW and not slow):
            continue
        echo = f"+ {doc}:{s['line']}: {s['runs']}"
        script += [f"echo {_quote(echo)}", s["runs"]]
    out = subprocess.run(["bash", "-c", "\n".join(script)], cwd=box, env=env, capture_output=True, text=True,
                         timeout=3600)
    assert out.returncode == 0, (f"{doc}: a command failed (exit {out.returncode}); the last one echoed is it\n"
                                 f"{out.stdout[-6000:]}\n{out.stderr[-6000:]}")
    return steps


def _quote(s: str) -> str:
    return "'" + s.replace("'", "'\\''") + "'"


def test_every_command_is_run_or_named():
    """The docs hold commands, each either run or, where a GPU or the package index is needed, named here; the
    commands not run are exactly the GPU ones."""
    for doc in DOCS:
        steps = plan(doc)
        assert len(steps) >= 5, doc
        for s in steps:
            assert s["command"].split()[0] in ("make", "python", "papermill", "kaggle", "export", "pip") or \
                re.match(r"^[A-Z_]+=", s["command"]), f"{doc}:{s['line']}: {s['command']}: not a command the test knows"
    not_run = [s["command"] for d in DOCS for s in plan(d) if s["runs"] is None]
    assert not_run == ['pip install -e ".[gpu]"', "python -m lab demo $RUN --stages 01_explore 02_sft"], not_run


def test_one_form_of_each_command():
    """One way to write a command everywhere: `python -m lab` (the venv active), overrides as key=value words (no
    `--overrides`, no `--` before them), `kaggle build` and `kaggle run` with the username in the environment."""
    for doc in DOCS:
        for s in plan(doc):
            c = s["command"]
            assert not re.search(r"\.venv/bin/\w+ ", c) and "--overrides" not in c and " -- " not in c, c
        text = (ROOT / doc).read_text(encoding="utf-8")
        assert "--overrides" not in text and ".venv/bin/python" not in text and ".venv/bin/papermill" not in text
    kaggle_page = [s["command"] for s in plan("kaggle_kernel/README.md")]
    assert kaggle_page.index("export KAGGLE_USERNAME=me") < min(
        i for i, c in enumerate(kaggle_page) if re.match(r"python -m lab kaggle (build|run|dataset)", c))


@pytest.mark.parametrize("doc", DOCS)
def test_doc_commands_run(doc, sandbox):
    """The fast lane: every command of the page but the slow ones (STAND_INS), in order."""
    run_doc(doc, sandbox, slow=False)
    box, env = sandbox
    if doc == "kaggle_kernel/README.md":  # the chain ran against the stand-in: fetched into the run folder
        assert sorted(p.name for p in (box / "outputs" / "comp1" / "kaggle").iterdir()) == \
            ["01_explore", "02_sft", "04_vote", "chain.json"]


@pytest.mark.slow  # the demo on the smoke budget three times, a sweep, papermill and the real model's memory trace
@pytest.mark.parametrize("doc", DOCS)
def test_doc_commands_run_all(doc, sandbox):
    """Every command of the page, the slow ones included, in order."""
    run_doc(doc, sandbox, slow=True)


if __name__ == "__main__":
    for d in DOCS:
        for s in plan(d):
            runs = "NOT RUN" if s["runs"] is None else "as written" if s["runs"] == s["command"] else s["runs"]
            print(f"{d}:{s['line']}\t{s['command']}\t{runs}\t{s['lane'] or 'fast'}\t{s['why']}")
