"""Offline Kaggle kernels: `python -m lab kaggle dataset` and `python -m lab kaggle build`.

Kaggle runs competition kernels without internet, so the lab reaches a kernel as a Kaggle dataset the kernel
installs from:
- `dataset` (`build_dataset`) writes `kaggle_kernel/build/dataset/`: dataset-metadata.json, the lab's wheel (built
  offline from a copy of pyproject.toml + lab/), `lab_src.tar.gz` (conf/, notebooks/, scripts/: the notebooks compose
  from `$LAB_ROOT/conf`) and requirements.txt pinned to the versions installed here (torch as the pyproject's range:
  Kaggle's image brings a CUDA torch). It downloads nothing; `--fetch-wheels` (`wheel_commands`) then fills the
  folder with wheels for Kaggle's Python on a machine with internet.
- `build --notebook 02_sft --overrides ...` (`build_kernel`) writes `kaggle_kernel/build/02_sft/`: kernel-metadata.json
  (internet off, private, GPU and `machine_shape`, sources from `conf/kaggle`) and the notebook with its parameters
  baked in by papermill's prepare-only mode, behind a first cell (`install_cell_source`) that checks the image's
  Python, installs the lab offline with only the extras the config needs (`kernel_extras`) and the fused Mamba
  kernels' wheels when the dataset holds them, unpacks the sources and continues a run attached with
  `--kernel-sources`. The overrides are composed here, so a typo fails now and not an hour into a Kaggle session;
  `run_dir` defaults to `/kaggle/working/outputs/<run_name>`. `--notebook pipeline` is one kernel that runs every
  stage through `lab.runs.pipeline.run_notebooks`.

What it simplifies:
1. One dependency dataset for every kernel.
2. No calls to the Kaggle API: push with the `kaggle` command-line tool (docs/scaling.md, section 6); the model source
   is checked with the rule kaggle 2.2.5 applies on push (`check_model_source`), and tests/test_kaggle.py runs
   kaggle's own push validation on a built kernel where the package is installed.
3. The username comes from --username or $KAGGLE_USERNAME, never from credential files.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path

from lab import LabError
from lab.core.config import compose, split_at_dashes
from lab.core.io import atomic_file, atomic_write_json, atomic_write_text
from lab.core.paths import KAGGLE_INPUT, project_root, resolve_path
from lab.runs.pipeline import STAGES
from lab.train.preflight import PIPELINE, kernel_extras
from lab.runs.sweep import parse_overrides

SDIST_ONLY = ("antlr4-python3-runtime==4.9.3",)  # dependencies PyPI has no wheel of (omegaconf's): built with pip wheel
PIP_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux2014_x86_64")
DIST_NAME = "nemotron-reasoning-lab"
WHEEL_GLOB = "nemotron_reasoning_lab-*.whl"
DATASET_TITLE = "Nemotron reasoning lab deps"
BUILD_DIR = "kaggle_kernel/build"
SRC_TARBALL = "lab_src.tar.gz"
SRC_FOLDERS = ("conf", "notebooks", "scripts")
KAGGLE_WORKING = "/kaggle/working"
LAB_ROOT_ON_KAGGLE = "/tmp/lab_root"
INSTALL_TAG = "lab-offline-install"
# the fused Mamba kernels' wheels (scripts/build_mamba_wheels.sh writes them into the dataset folder) and the one
# dependency of theirs the lab's set lacks (mamba_ssm's Triton scan imports einops); lab.model.models.check_mamba_kernels
MAMBA_WHEEL_GLOBS = ("causal_conv1d-*.whl", "mamba_ssm-*.whl")
MAMBA_EXTRA_DEP = "einops==0.8.2"


def slugify(title: str) -> str:
    """Kaggle's slug of a title: lowercase, every run of non-alphanumerics becomes one '-', no '-' at the ends."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def _username(username: str | None) -> str:
    u = username or os.environ.get("KAGGLE_USERNAME")
    if not u:
        raise LabError("no Kaggle username: pass --username NAME or set $KAGGLE_USERNAME")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", u):
        raise LabError(f"--username {u!r}: not a Kaggle username")
    return u


def _check_title(title: str, what: str, lo: int, hi: int) -> str:
    slug = slugify(title)
    if not lo <= len(title) <= hi or len(slug) < 3:
        raise LabError(f"{what} title {title!r}: Kaggle wants {lo} to {hi} characters with a slug of at least 3")
    return slug


def check_model_source(handle: str) -> str:
    """A Kaggle Models handle as kaggle 2.2.5 accepts it in `model_sources`: owner/model/framework/instance/version,
    five non-empty parts, the version an integer (`KaggleApi.validate_model_instance_version_string`,
    kaggle/api/kaggle_api_extended.py, which `kaggle kernels push` calls on every model source)."""
    parts = handle.split("/")
    if len(parts) != 5 or not all(parts) or not parts[4].isdigit():
        raise LabError(f"model source {handle!r}: Kaggle wants owner/model/framework/instance/version with an integer "
                       "version (copy it from the model's Kaggle page; conf/kaggle/default.yaml model_source, or "
                       "--model-source)")
    return handle


# ---- the dependency dataset ----------------------------------------------------------------------------------------

def _pyproject() -> dict:
    p = project_root() / "pyproject.toml"
    if not p.is_file():
        raise LabError(f"{p}: not found (the wheel and requirements.txt are built from it)")
    return tomllib.loads(p.read_text(encoding="utf-8"))


def requirements(gpu_extra: bool = True) -> list[str]:
    """The lab's dependencies pinned to the versions installed here; torch keeps the pyproject's range
    (or the GPU extra's pin): Kaggle's image brings a CUDA torch, a CPU build from here would be wrong."""
    from packaging.requirements import Requirement

    proj = _pyproject()["project"]
    deps = [Requirement(d) for d in proj.get("dependencies", [])]
    extra = [Requirement(d) for d in proj.get("optional-dependencies", {}).get("gpu", [])] if gpu_extra else []
    extra_names = {r.name.lower() for r in extra}  # the GPU extra pins these

    def pinned(r: Requirement) -> str:
        try:
            v = metadata.version(r.name).split("+")[0]
        except metadata.PackageNotFoundError:
            return str(r)
        return f"{r.name}=={v}" if r.name.lower() != "torch" and r.specifier.contains(v, prereleases=True) else str(r)

    return [pinned(r) for r in deps if r.name.lower() not in extra_names] + [str(r) for r in extra]


def _build_wheel(dest: Path) -> Path:
    """`pip wheel --no-deps --no-build-isolation --no-index` on a temporary copy of the package (offline)."""
    root = project_root()
    for old in dest.glob(WHEEL_GLOB):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="lab_wheel_") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        shutil.copy2(root / "pyproject.toml", src / "pyproject.toml")
        shutil.copytree(root / "lab", src / "lab", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        readme = root / "README.md"
        (src / "README.md").write_text(readme.read_text(encoding="utf-8") if readme.is_file() else "", encoding="utf-8")
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
               "--disable-pip-version-check", "-q", str(src), "-w", str(dest)]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        if out.returncode != 0:
            raise LabError(f"{root / 'pyproject.toml'}: building the wheel failed ({' '.join(cmd)}):\n"
                           f"{out.stdout[-2000:]}{out.stderr[-2000:]}")
    wheels = sorted(dest.glob(WHEEL_GLOB))
    if not wheels:
        raise LabError(f"{dest}: pip wheel wrote no {WHEEL_GLOB}")
    return wheels[-1]


def _source_tarball(dest: Path) -> Path:
    """conf/, notebooks/, scripts/ as a reproducible .tar.gz (sorted, no timestamps or owners), written atomically."""
    root = project_root()
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for folder in SRC_FOLDERS:
            for p in sorted((root / folder).rglob("*")):
                rel = p.relative_to(root)
                if not p.is_file() or p.suffix == ".pyc" or any(part == "__pycache__" or part.startswith(".")
                                                                for part in rel.parts):
                    continue
                info = tarfile.TarInfo(str(rel))
                data = p.read_bytes()
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
    path = dest / SRC_TARBALL
    with atomic_file(path) as tmp:
        tmp.write_bytes(buf.getvalue())
    return path


def build_dataset(username: str | None = None, out: str | os.PathLike | None = None, title: str = DATASET_TITLE,
                  license_name: str = "other", gpu_extra: bool = True, wheel: bool = True) -> Path:
    """Write the dependency dataset's folder (metadata, wheel, source tarball, requirements.txt)."""
    user = _username(username)
    slug = _check_title(title, "dataset", 6, 50)
    out = resolve_path(out or f"{BUILD_DIR}/dataset")
    out.mkdir(parents=True, exist_ok=True)
    reqs = requirements(gpu_extra)
    atomic_write_text(out / "requirements.txt", "\n".join([
        "# Pinned dependencies of nemotron-reasoning-lab (generated by `python -m lab kaggle dataset`).",
        "# Fill this folder with wheels on a machine WITH internet, for Kaggle's Python and platform:",
        "#   python -m lab kaggle dataset --fetch-wheels   (runs, in this folder:)",
        *["#   python " + " ".join(c[1:]).replace(str(out), ".") for c in wheel_commands(out)],
        "# Kaggle installs them offline: pip install --no-index --find-links <this folder> nemotron-reasoning-lab",
        *reqs, ""]))
    if wheel:
        _build_wheel(out)
    _source_tarball(out)
    atomic_write_json(out / "dataset-metadata.json", {
        "title": title, "id": f"{user}/{slug}", "licenses": [{"name": license_name}],
        "description": "The nemotron-reasoning-lab wheel, its pinned dependencies as wheels (requirements.txt) and "
                       f"the lab's conf/ and notebooks/ ({SRC_TARBALL}), for offline Kaggle kernels."})
    return out


def wheel_commands(folder: str | os.PathLike, python_version: str | None = None) -> list[list[str]]:
    """The pip calls that fill the dataset folder with wheels for Kaggle (run on a machine WITH internet):
    first `pip wheel` builds the dependencies PyPI has only as source (`SDIST_ONLY`: antlr4-python3-runtime 4.9.3,
    which omegaconf pins, is pure Python), then `pip download` fetches every other pinned dependency as a binary
    wheel for Kaggle's Python and platform, finding the built ones in the same folder."""
    folder = str(folder)
    python_version = python_version or str(compose([]).kaggle.python_version)  # conf/kaggle: Kaggle's image
    pip = [sys.executable, "-m", "pip"]
    return [[*pip, "wheel", "--no-deps", "--wheel-dir", folder, *SDIST_ONLY],
            [*pip, "download", "--requirement", str(Path(folder) / "requirements.txt"), "--dest", folder,
             "--find-links", folder, "--only-binary=:all:", "--python-version", python_version,
             *[f"--platform={p}" for p in PIP_PLATFORMS]]]


def fetch_wheels(folder: str | os.PathLike, python_version: str | None = None) -> Path:
    """Run `wheel_commands` (needs internet; tests never call it)."""
    folder = resolve_path(folder)
    if not (folder / "requirements.txt").is_file():
        raise LabError(f"{folder}: no requirements.txt (run `python -m lab kaggle dataset` first)")
    for cmd in wheel_commands(folder, python_version):
        print("+", " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            raise LabError(f"{folder}: `{' '.join(cmd[2:4])}` failed (output above)")
    return folder


# ---- the kernel ----------------------------------------------------------------------------------------------------

def install_cell_source(dataset_slug: str, run_dir: str, package: str = DIST_NAME,
                        python_version: str | None = None) -> str:
    """The first cell of a built kernel: the image's Python checked against `python_version` (the wheel set's,
    `kaggle.python_version`; None: not checked), offline install from the attached dataset (and the fused Mamba
    kernels' wheels when the dataset holds them, `MAMBA_WHEEL_GLOBS`), LAB_ROOT, earlier outputs."""
    check = "" if python_version is None else f'''
_py = "%d.%d" % sys.version_info[:2]
if _py != "{python_version}":
    raise RuntimeError("this image runs Python " + _py + ", but the kernel and its wheel dataset were built for "
                       "{python_version} (kaggle.python_version): rebuild the dataset with `python -m lab kaggle dataset "
                       "--fetch-wheels --python-version " + _py + "` (and scripts/build_mamba_wheels.sh with "
                       "PYTHON_VERSION=" + _py + "), then the kernel with kaggle.python_version=" + _py)
'''
    return f'''# Offline setup, inserted by `python -m lab kaggle build`: this kernel has no internet access.
# Installs the lab and its pinned dependencies from the attached dataset ({dataset_slug}) and, when it holds them,
# the fused Mamba kernels' wheels; unpacks the lab's conf/ and notebooks/ to {LAB_ROOT_ON_KAGGLE} (LAB_ROOT) and,
# when another kernel's output with this run is attached, copies it to RUN_DIR so this stage continues that run.
import glob, importlib, os, shutil, subprocess, sys, tarfile
{check}
LAB_DATASET = "{dataset_slug}"
RUN_DIR = "{run_dir}"
_wheels = (sorted(glob.glob("{KAGGLE_INPUT}/" + LAB_DATASET + "/{WHEEL_GLOB}"))
           or sorted(glob.glob("{KAGGLE_INPUT}/**/{WHEEL_GLOB}", recursive=True)))
if not _wheels:
    raise FileNotFoundError("no {WHEEL_GLOB} under {KAGGLE_INPUT}: attach the dataset " + LAB_DATASET
                            + " (built by `python -m lab kaggle dataset`)")
LAB_DEPS = os.path.dirname(_wheels[-1])
subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", LAB_DEPS,
                "{package}"], check=True)
_mamba = [w for g in {list(MAMBA_WHEEL_GLOBS)!r} for w in sorted(glob.glob(os.path.join(LAB_DEPS, g)))[-1:]]
if _mamba:  # scripts/build_mamba_wheels.sh: no deps resolved (tilelang, quack-kernels are optional), einops is imported
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", LAB_DEPS, "--no-deps",
                    *_mamba, "{MAMBA_EXTRA_DEP}"], check=True)
importlib.invalidate_caches()

LAB_ROOT = "{LAB_ROOT_ON_KAGGLE}"
_src = os.path.join(LAB_DEPS, "{SRC_TARBALL}")
if os.path.isfile(_src):
    with tarfile.open(_src) as _t:
        try:
            _t.extractall(LAB_ROOT, filter="data")
        except TypeError:  # Python without extraction filters
            _t.extractall(LAB_ROOT)
else:  # Kaggle unpacked the archive into a folder
    _conf = sorted(glob.glob(LAB_DEPS + "/**/conf/config.yaml", recursive=True))
    if not _conf:
        raise FileNotFoundError("neither {SRC_TARBALL} nor conf/config.yaml in " + LAB_DEPS)
    LAB_ROOT = os.path.dirname(os.path.dirname(_conf[0]))
os.environ["LAB_ROOT"] = LAB_ROOT

if RUN_DIR.startswith("{KAGGLE_WORKING}/"):
    for _prev in sorted(glob.glob("{KAGGLE_INPUT}/*/" + os.path.relpath(RUN_DIR, "{KAGGLE_WORKING}"))):
        print("continuing the run in", _prev)
        shutil.copytree(_prev, RUN_DIR, dirs_exist_ok=True)
print("lab installed from", LAB_DEPS, "| LAB_ROOT =", LAB_ROOT, "| run_dir =", RUN_DIR)
'''


def _pipeline_notebook():
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.cells = [
        nbformat.v4.new_markdown_cell(
            "# Nemotron reasoning lab: every stage\n\nRuns the lab's stage notebooks in order with papermill "
            "(`lab.runs.pipeline.run_notebooks`), each with the same overrides; the executed notebooks, every stage's "
            "outputs and `summary.md` land in the run folder under /kaggle/working."),
        nbformat.v4.new_code_cell("# Hydra overrides for this run; the kernel builder bakes them in.\n"
                                  "overrides: list[str] = []\nstages: list[str] = " + json.dumps(STAGES),
                                  metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("from lab.runs.pipeline import run_notebooks, summary\n\n"
                                  "run_dir = run_notebooks(overrides, stages)\nsummary(run_dir)\n"
                                  "print(open(run_dir / 'summary.md').read())"),
    ]
    return nb


def _notebook_name(notebook: str) -> str:
    name = Path(notebook).name.removesuffix(".ipynb")
    if name not in (*STAGES, PIPELINE):
        raise LabError(f"--notebook {notebook!r}: one of {', '.join(STAGES)} or {PIPELINE}")
    return name


def _from_config(value: str | None, default) -> str | None:
    """A command-line value, else the config's; '' means none."""
    value = default if value is None else value
    return str(value) if value else None


def build_kernel(notebook: str, overrides: list[str] = (), username: str | None = None, title: str | None = None,
                 out: str | os.PathLike | None = None, competition: str | None = None,
                 model_source: str | None = None, dataset: str | None = None, enable_gpu: bool = True,
                 run_name: str | None = None, kernel_sources: list[str] = (), machine_shape: str | None = None,
                 gpu_extra: bool = True) -> Path:
    """Write a push-ready kernel folder: kernel-metadata.json and the parameterised notebook.

    `competition`, `model_source` and `machine_shape` default to `conf/kaggle` of the composed config ('' for
    none); `machine_shape` is written only for a GPU kernel. The install cell installs the lab with the extras
    a GPU kernel needs (`kernel_extras`: vllm, unsloth, bnb, from the config) unless `gpu_extra` is False (none);
    the dataset must hold their wheels.
    """
    import nbformat
    import papermill as pm

    name = _notebook_name(notebook)
    user = _username(username)
    title = title or f"Nemotron lab {name}"
    slug = _check_title(title, "kernel", 5, 50)
    dataset = dataset or f"{user}/{slugify(DATASET_TITLE)}"
    if not re.fullmatch(r"[A-Za-z0-9_-]+/[a-z0-9-]+", dataset):
        raise LabError(f"--dataset {dataset!r}: expected owner/dataset-slug")
    for k in kernel_sources:  # kaggle 2.2.5 validate_kernel_string: owner/slug[/version], slug of 5+ characters
        if not re.fullmatch(r"[^/]+/[^/]{5,}(/[^/]+)?", k):
            raise LabError(f"--kernel-sources {k!r}: expected owner/kernel-slug (slug of at least 5 characters)")
    overrides = list(overrides)
    keys = {o.key_or_group for o in parse_overrides(overrides)}
    run_name = run_name or slug
    if "run_dir" not in keys:
        overrides.append(f"run_dir={KAGGLE_WORKING}/outputs/{run_name}")
    cfg = compose(overrides)  # fails here, with the key named, rather than on Kaggle
    run_dir = cfg.run_dir
    if not run_dir.startswith("/kaggle/"):
        print(f"warning: run_dir={run_dir} is not under {KAGGLE_WORKING}; outputs elsewhere are not kept by Kaggle",
              file=sys.stderr)
    competition = _from_config(competition, cfg.kaggle.competition)
    model_source = _from_config(model_source, cfg.kaggle.model_source)
    if model_source:
        check_model_source(model_source)
    machine_shape = _from_config(machine_shape, cfg.kaggle.machine_shape) if enable_gpu else None

    src = _pipeline_notebook() if name == PIPELINE else str(project_root() / "notebooks" / f"{name}.ipynb")
    nb = pm.execute_notebook(src, None, parameters={"overrides": overrides}, prepare_only=True, progress_bar=False,
                             kernel_name="python3", language="python")
    for k in ("input_path", "output_path"):
        nb.metadata.get("papermill", {}).pop(k, None)
    extras = kernel_extras(cfg, name) if enable_gpu and gpu_extra else []
    package = DIST_NAME + (f"[{','.join(extras)}]" if extras else "")
    install = nbformat.v4.new_code_cell(install_cell_source(dataset.split("/", 1)[1], run_dir, package,
                                                            str(cfg.kaggle.python_version)),
                                        metadata={"tags": [INSTALL_TAG]})
    nb.cells.insert(0, install)
    nbformat.validate(nb)

    out = resolve_path(out or f"{BUILD_DIR}/{name}")
    out.mkdir(parents=True, exist_ok=True)
    code_file = f"{name}.ipynb"
    atomic_write_text(out / code_file, nbformat.writes(nb))
    meta = {"id": f"{user}/{slug}", "title": title, "code_file": code_file, "language": "python",
            "kernel_type": "notebook", "is_private": True, "enable_gpu": bool(enable_gpu), "enable_tpu": False,
            "enable_internet": False, "dataset_sources": [dataset],
            "competition_sources": [competition] if competition else [],
            "kernel_sources": list(kernel_sources), "model_sources": [model_source] if model_source else []}
    if machine_shape:
        meta["machine_shape"] = machine_shape
    atomic_write_json(out / "kernel-metadata.json", meta)
    return out


# ---- command line --------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    argv, extra = split_at_dashes(argv)
    ap = argparse.ArgumentParser(prog="python -m lab kaggle", description="offline Kaggle kernels and their dataset")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="a push-ready kernel folder for one notebook (or the whole pipeline)",
                       epilog="example: python -m lab kaggle build --notebook 02_sft --username me "
                              "--overrides model=nemotron_nano data=competition")
    b.add_argument("--notebook", required=True, help=f"one of {', '.join(STAGES)} or {PIPELINE}")
    b.add_argument("--overrides", nargs="*", default=[], help="Hydra overrides baked into the notebook")
    b.add_argument("--username", help="your Kaggle username (default: $KAGGLE_USERNAME)")
    b.add_argument("--title", help="kernel title; its slug is the kernel id (default: 'Nemotron lab NAME')")
    b.add_argument("--out", help=f"folder to write (default: {BUILD_DIR}/NAME)")
    b.add_argument("--competition", help="competition slug; '' for none (default: kaggle.competition)")
    b.add_argument("--model-source", help="Kaggle Models handle owner/model/framework/instance/version; '' for none "
                        "(default: kaggle.model_source in conf/kaggle/default.yaml)")
    b.add_argument("--dataset", help=f"owner/slug of the dependency dataset (default: USER/{slugify(DATASET_TITLE)})")
    b.add_argument("--kernel-sources", nargs="*", default=[],
                   help="other kernels (owner/slug) whose output to attach; their outputs/<run_name> is continued")
    b.add_argument("--run-name", help="run folder under /kaggle/working/outputs (default: the slug)")
    b.add_argument("--no-gpu", action="store_true", help="enable_gpu: false")
    b.add_argument("--machine-shape", help="Kaggle machine_shape (accelerator) of a GPU kernel, e.g. NvidiaTeslaT4 "
                                           "(default: kaggle.machine_shape)")
    b.add_argument("--no-gpu-extra", action="store_true",
                   help="install the lab without vllm/unsloth (default: the extras the config needs, on a GPU kernel)")
    d = sub.add_parser("dataset", help="the dataset folder with the lab's wheel, conf/notebooks and requirements.txt")
    d.add_argument("--username", help="your Kaggle username (default: $KAGGLE_USERNAME)")
    d.add_argument("--title", default=DATASET_TITLE, help="dataset title; its slug is the dataset id (default: %(default)s)")
    d.add_argument("--out", help=f"folder to write (default: {BUILD_DIR}/dataset)")
    d.add_argument("--license", default="other", help="Kaggle license name (default: %(default)s)")
    d.add_argument("--no-gpu-extra", action="store_true", help="leave the GPU extras (vllm, unsloth, torch pin) out")
    d.add_argument("--no-wheel", action="store_true", help="skip building the wheel (metadata and sources only)")
    d.add_argument("--fetch-wheels", action="store_true",
                   help="then fill the folder with the dependency wheels (needs internet): pip wheel for "
                        f"{', '.join(SDIST_ONLY)}, pip download --only-binary=:all: for the rest")
    d.add_argument("--python-version", help="Kaggle's Python for --fetch-wheels (default: kaggle.python_version in "
                                            "conf/kaggle/default.yaml)")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        out = build_kernel(args.notebook, [*args.overrides, *extra], username=args.username, title=args.title,
                           out=args.out, competition=args.competition, model_source=args.model_source,
                           dataset=args.dataset, enable_gpu=not args.no_gpu, run_name=args.run_name,
                           kernel_sources=args.kernel_sources, machine_shape=args.machine_shape,
                           gpu_extra=not args.no_gpu_extra)
        meta = json.loads((out / "kernel-metadata.json").read_text())
        acc = f" --accelerator {meta['machine_shape']}" if meta.get("machine_shape") else ""
        print(f"wrote {out}: {meta['code_file']} and kernel-metadata.json (id {meta['id']})\n"
              f"push it with: kaggle kernels push -p {out}{acc}")
    else:
        if extra:
            raise LabError(f"`kaggle dataset` takes no overrides (got {extra})")
        out = build_dataset(args.username, args.out, args.title, args.license, gpu_extra=not args.no_gpu_extra,
                            wheel=not args.no_wheel)
        if args.fetch_wheels:
            fetch_wheels(out, args.python_version)
        meta = json.loads((out / "dataset-metadata.json").read_text())
        todo = "" if args.fetch_wheels else ("fill it with wheels on a machine with internet (`python -m lab kaggle "
                                              "dataset --fetch-wheels`, see docs/scaling.md, section 6), then: ")
        print(f"wrote {out} (id {meta['id']}): " + ", ".join(sorted(p.name for p in out.iterdir()))[:2000] +
              f"\nnext: {todo}kaggle datasets create -p {out}")
    return 0
