"""Offline Kaggle kernels: `python -m lab kaggle dataset`, `build` and `plan` (the how-to: kaggle_kernel/README.md).

Kaggle runs competition kernels without internet, so the lab reaches a kernel as a Kaggle dataset it installs from:
- `dataset` (`build_dataset`) writes kaggle_kernel/build/dataset/: its metadata, the lab's wheel, the tracked conf/,
  notebooks/ and scripts/ (`lab_src.tar.gz`) and requirements.txt pinned to the versions installed here; only files
  git tracks go in. It downloads nothing; `--fetch-wheels` then adds binary wheels for Kaggle's Python and glibc.
- `build --notebook 02_sft OVERRIDES` (`build_kernel`) writes kaggle_kernel/build/02_sft/: kernel-metadata.json
  (internet off, private, the GPU) and the notebook with its parameters baked in, behind an install cell
  (kaggle_kernel/install_cell.py filled) that installs the lab offline and copies back what the stage reads from an
  attached kernel. The overrides are composed here, so a typo fails now, not an hour into a Kaggle session; `run_dir`
  must stay inside /kaggle/working and an override naming a path on this machine is refused. `--chain` writes one
  kernel per stage, each attaching the one before; `--notebook pipeline` is one kernel for every stage.
- `plan OVERRIDES` (`plan_main`): each stage's planned bytes in /kaggle/working and in scratch (lab.plan.output_plan).
Building calls no Kaggle API (pushing: the `kaggle` tool or `python -m lab kaggle run`, lab.kaggle.run); the
username comes from --username or $KAGGLE_USERNAME, never from credential files. Each step in detail:
docs/internals.md, lab.kaggle.kernel.
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
from datetime import datetime
from importlib import metadata
from pathlib import Path

from lab import LabError
from lab.core import owner
from lab.core.config import compose, split_at_dashes
from lab.core.io import atomic_file, atomic_write_json, atomic_write_text
from lab.core.paths import project_root, resolve_path
from lab.runs.pipeline import STAGES
from lab.plan.preflight import PIPELINE, kernel_extras
from lab.runs.sweep import parse_overrides

SDIST_ONLY = ("antlr4-python3-runtime==4.9.3",)  # dependencies PyPI has no wheel of (omegaconf's): built with pip wheel
# Kaggle's image is built on Colab's, Ubuntu 22.04 (glibc 2.35; not checked against a live kernel here): every
# manylinux tag up to glibc 2.35 runs there. pip does not widen `--platform manylinux_2_28_x86_64` to the older
# manylinux_2_x tags (pip/_internal/utils/compatibility_tags.py `_get_custom_platforms` widens only manylinux2014 and
# manylinux2010), so each is named: nvidia-cublas 13 ships manylinux_2_27 only, llguidance manylinux_2_31, debugpy
# and cryptography manylinux_2_34 (resolved with this list for Python 3.12).
KAGGLE_GLIBC = (2, 35)
PIP_PLATFORMS = (*(f"manylinux_2_{m}_x86_64" for m in range(KAGGLE_GLIBC[1], 16, -1)), "manylinux2014_x86_64",
                 "manylinux_2_12_x86_64", "manylinux_2_5_x86_64")
DIST_NAME = "nemotron-reasoning-lab"
WHEEL_GLOB = "nemotron_reasoning_lab-*.whl"
DATASET_TITLE = "Nemotron reasoning lab deps"
BUILD_DIR = "kaggle_kernel/build"
SRC_TARBALL = "lab_src.tar.gz"
SRC_FOLDERS = ("conf", "notebooks", "scripts")
KAGGLE_INPUT = "/kaggle/input"  # a built kernel's paths are Kaggle's, whatever $LAB_KAGGLE_ROOT says here
KAGGLE_WORKING = "/kaggle/working"
LAB_ROOT_ON_KAGGLE = "/tmp/lab_root"
INSTALL_TAG = "lab-offline-install"
# the fused Mamba kernels' wheels (scripts/build_mamba_wheels.sh writes them into the dataset folder) and the one
# dependency of theirs the lab's set lacks (mamba_ssm's Triton scan imports einops);
# lab.model.models.check_mamba_kernels
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


def tracked_files(files: list[str] | None = None) -> list[str]:
    """The project's files that may go into the dataset, relative to the project root: `files` when given (an
    explicit list, for a copy that is not a git checkout), else what git tracks (`git ls-files`), never what lies
    untracked beside it (a conf/private/secrets.yaml, scratch notebooks). A tracked file deleted here is left out."""
    root = project_root()
    if files is None:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached"], capture_output=True)
        if out.returncode != 0:
            raise LabError(f"{root}: not a git checkout (git ls-files: {out.stderr.decode(errors='replace').strip()}); "
                           "pass the files to pack explicitly (`python -m lab kaggle dataset --files-from LIST`)")
        files = [f for f in out.stdout.decode().split("\0") if f]
    chosen = []
    for f in files:
        rel = Path(f)
        if rel.is_absolute() or ".." in rel.parts:
            raise LabError(f"{f}: the dataset packs files inside {root} only, named relative to it")
        if (root / rel).is_file():
            chosen.append(rel.as_posix())
    return sorted(set(chosen))


def _under(files: list[str], folder: str) -> list[str]:
    return [f for f in files if f.startswith(folder + "/") and "__pycache__" not in f and not f.endswith(".pyc")]


def _build_wheel(dest: Path, files: list[str] | None = None) -> Path:
    """`pip wheel --no-deps --no-build-isolation --no-index` on a temporary copy of pyproject.toml and the tracked
    files of lab/ and conf/ (`tracked_files`; offline; the wheel ships conf/ as lab/conf)."""
    root = project_root()
    files = tracked_files() if files is None else files
    for old in dest.glob(WHEEL_GLOB):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="lab_wheel_") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        shutil.copy2(root / "pyproject.toml", src / "pyproject.toml")
        for f in _under(files, "lab") + _under(files, "conf"):
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / f, src / f)
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


def _source_tarball(dest: Path, files: list[str] | None = None) -> Path:
    """The tracked files of conf/, notebooks/, scripts/ (`tracked_files`) as a reproducible .tar.gz (sorted, no
    timestamps or owners), written atomically."""
    root = project_root()
    files = tracked_files() if files is None else files
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for folder in SRC_FOLDERS:
            for rel in _under(files, folder):
                if any(part.startswith(".") for part in Path(rel).parts):
                    continue
                info = tarfile.TarInfo(rel)
                data = (root / rel).read_bytes()
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
    path = dest / SRC_TARBALL
    with atomic_file(path) as tmp:
        tmp.write_bytes(buf.getvalue())
    return path


def build_dataset(username: str | None = None, out: str | os.PathLike | None = None, title: str = DATASET_TITLE,
                  license_name: str = "other", gpu_extra: bool = True, wheel: bool = True,
                  files: list[str] | None = None, force: bool = False) -> Path:
    """Write the dependency dataset's folder (metadata, wheel, source tarball, requirements.txt) from the files git
    tracks, or from `files` (`tracked_files`)."""
    files = tracked_files(files)
    user = _username(username)
    slug = _check_title(title, "dataset", 6, 50)
    out = owner.output_dir(resolve_path(out or f"{BUILD_DIR}/dataset"), "kaggle dataset", force)  # new, or its own
    reqs = requirements(gpu_extra)
    atomic_write_text(out / "requirements.txt", "\n".join([
        "# Pinned dependencies of nemotron-reasoning-lab (generated by `python -m lab kaggle dataset`).",
        "# Fill this folder with wheels on a machine WITH internet, for Kaggle's Python and platform:",
        "#   python -m lab kaggle dataset --fetch-wheels   (runs, in this folder:)",
        *["#   python " + owner.quote_command(*(w.replace(str(out), ".") for w in c[1:])) for c in wheel_commands(out)],
        "# Kaggle installs them offline: pip install --no-index --find-links <this folder> nemotron-reasoning-lab",
        *reqs, ""]))
    if wheel:
        _build_wheel(out, files)
    _source_tarball(out, files)
    meta = json.loads(template("dataset-metadata.json"))
    meta.update({"title": title, "id": f"{user}/{slug}", "licenses": [{"name": license_name}]})
    atomic_write_json(out / "dataset-metadata.json", meta)
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
    """Run `wheel_commands` (needs the package index; tests never call it), then print every wheel in the folder with
    its size and the total. A pin with no binary wheel for Kaggle's Python and platform is a LabError naming it."""
    folder = resolve_path(folder)
    if not (folder / "requirements.txt").is_file():
        raise LabError(f"{folder}: no requirements.txt (run `python -m lab kaggle dataset` first)")
    for cmd in wheel_commands(folder, python_version):
        print("+", owner.quote_command(*cmd), flush=True)
        out = subprocess.run(cmd, capture_output=True, text=True)
        stdout, stderr = getattr(out, "stdout", None) or "", getattr(out, "stderr", None) or ""
        sys.stdout.write(stdout[-4000:])
        if out.returncode != 0:
            log = stdout + stderr
            missing = re.findall(r"No matching distribution found for ([^\s]+)", log)
            py = python_version or str(compose([]).kaggle.python_version)
            if missing:
                raise LabError(f"{folder}: no binary wheel of {', '.join(sorted(set(missing)))} for Python {py} on "
                               f"{PIP_PLATFORMS[0]} or older manylinux (`pip {cmd[3]}` --only-binary=:all:): pin a "
                               "version that has one, or build it with `pip wheel` into this folder first")
            raise LabError(f"{folder}: `pip {cmd[3]}` failed:\n{log[-3000:]}")
    print(wheel_list(folder))
    return folder


def wheel_list(folder: str | os.PathLike) -> str:
    """Every wheel in `folder` with its size, largest first, and the total."""
    wheels = sorted(Path(folder).glob("*.whl"), key=lambda p: (-p.stat().st_size, p.name))
    total = sum(p.stat().st_size for p in wheels)
    return "\n".join([f"{len(wheels)} wheels, {total / 1e9:.2f} GB in all:",
                      *(f"{p.stat().st_size / 1e6:10.1f} MB  {p.name}" for p in wheels)])


# ---- the kernel ----------------------------------------------------------------------------------------------------

# the install cell, the metadata and the pipeline notebook, as files (kaggle_kernel/README.md)
TEMPLATES = "kaggle_kernel"
FILLED = ("# ---- FILLED by `python -m lab kaggle build`", "# ---- end of FILLED ----")


def template(name: str) -> str:
    """The text of kaggle_kernel/NAME: of the checkout this package lives in, else of the project root ($LAB_ROOT)."""
    p = Path(__file__).resolve().parents[2] / TEMPLATES / name
    if not p.is_file():
        p = project_root() / TEMPLATES / name
    if not p.is_file():
        raise LabError(f"{p}: kernel template not found (kaggle_kernel/ is part of the lab's checkout)")
    return p.read_text(encoding="utf-8")


def install_cell_source(dataset_slug: str, run_dir: str, package: str = DIST_NAME, python_version: str | None = None,
                        copy_back: list[str] | None = None, resume: str | None = None,
                        scratch_dir: str | None = "/kaggle/temp") -> str:
    """The first cell of a built kernel: kaggle_kernel/install_cell.py with its FILLED block set to these values:
    the image's Python checked against `python_version` (the wheel set's, `kaggle.python_version`; None: not
    checked), offline install from the attached dataset (and the fused Mamba kernels' wheels when the dataset holds
    them, `MAMBA_WHEEL_GLOBS`), LAB_ROOT, and from an attached earlier kernel the paths of the run `copy_back`
    (None: the whole run but its checkpoints) into RUN_DIR and the resumable state `resume` (checkpoints/<stage>)
    into the scratch folder (`lab.core.paths.checkpoint_root`)."""
    text = template("install_cell.py")
    head, mark, rest = text.partition(FILLED[0])
    _, end, tail = rest.partition(FILLED[1])
    if not mark or not end:
        raise LabError(f"{project_root() / TEMPLATES / 'install_cell.py'}: the FILLED markers are missing")
    values = {"LAB_DATASET": dataset_slug, "RUN_DIR": run_dir, "PACKAGE": package, "PYTHON_VERSION": python_version,
              "COPY_BACK": copy_back, "RESUME": resume, "RUN_MARKER": owner.RUN_MARKER,
              "SCRATCH_DIR": scratch_dir or None,
              "KAGGLE_INPUT": KAGGLE_INPUT, "KAGGLE_WORKING": KAGGLE_WORKING, "LAB_ROOT": LAB_ROOT_ON_KAGGLE,
              "WHEEL_GLOB": WHEEL_GLOB, "MAMBA_WHEEL_GLOBS": list(MAMBA_WHEEL_GLOBS),
              "MAMBA_EXTRA_DEP": MAMBA_EXTRA_DEP, "SRC_TARBALL": SRC_TARBALL}
    block = "\n".join(f"{k} = {'None' if v is None else json.dumps(v)}" for k, v in values.items())
    return f"{head}{mark} (values of this kernel) ----\n{block}\n{end}{tail}"


def _pipeline_notebook():
    import nbformat

    return nbformat.reads(template("pipeline.ipynb"), as_version=4)


def _notebook_name(notebook: str) -> str:
    name = Path(notebook).name.removesuffix(".ipynb")
    if name not in (*STAGES, PIPELINE):
        raise LabError(f"--notebook {notebook!r}: one of {', '.join(STAGES)} or {PIPELINE}")
    return name


def _from_config(value: str | None, default) -> str | None:
    """A command-line value, else the config's; '' means none."""
    value = default if value is None else value
    return str(value) if value else None


def check_run_dir(run_dir: str) -> str:
    """`run_dir` normalised; a LabError unless it lies strictly inside /kaggle/working (what Kaggle keeps of a
    kernel, and where the next kernel finds the run): `--run-name ../../etc` or `run_dir=/tmp/x` are refused."""
    norm = os.path.normpath(str(run_dir))
    if not norm.startswith(KAGGLE_WORKING + "/"):
        raise LabError(f"run_dir={run_dir} (normalised {norm}) is not inside {KAGGLE_WORKING}: Kaggle keeps only that "
                       "folder of a kernel, so the run would be lost and the next kernel could not continue it; "
                       f"use --run-name NAME (a folder name: {KAGGLE_WORKING}/outputs/NAME) or run_dir="
                       f"{KAGGLE_WORKING}/...")
    return norm


def check_run_name(run_name: str) -> str:
    """A LabError unless `--run-name` is a relative folder name that stays inside /kaggle/working/outputs."""
    norm = os.path.normpath(os.path.join("outputs", str(run_name)))
    if not str(run_name).strip() or os.path.isabs(str(run_name)) or not norm.startswith("outputs" + os.sep):
        raise LabError(f"--run-name {run_name!r} leaves {KAGGLE_WORKING}/outputs (the run folder would be "
                       f"{os.path.normpath(os.path.join(KAGGLE_WORKING, norm))}): a run name is a folder name, "
                       "e.g. comp1")
    return run_name


_PATHISH = re.compile(r"^(~|\.{1,2}/|/)")


def local_paths(overrides: list[str]) -> list[str]:
    """The overrides whose value names a path on this machine, which a Kaggle kernel cannot read: an absolute path
    outside /kaggle, a path starting with ~ or ./ or ../, or a relative path that exists here outside the folders
    the dataset ships (conf/, notebooks/, scripts/: unpacked to LAB_ROOT on Kaggle). Values of lists are checked one
    by one; interpolations (${...}) are not paths."""
    found = []
    for o in overrides:
        key, eq, value = o.partition("=")
        if not eq or key.strip().lstrip("+~") == "run_dir":  # run_dir: check_run_dir
            continue
        for atom in re.split(r"[,\[\]]", value):
            v = atom.strip().strip("'\"")
            if not v or "${" in v or v.startswith("/kaggle/"):
                continue
            shipped = v.split("/")[0] in SRC_FOLDERS
            if _PATHISH.match(v) or ("/" in v and not shipped and resolve_path(v).exists()):
                found.append(o)
                break
    return found


def build_kernel(notebook: str, overrides: list[str] = (), username: str | None = None, title: str | None = None,
                 out: str | os.PathLike | None = None, competition: str | None = None,
                 model_source: str | None = None, dataset: str | None = None, enable_gpu: bool = True,
                 run_name: str | None = None, kernel_sources: list[str] = (), machine_shape: str | None = None,
                 gpu_extra: bool = True, allow_local_paths: bool = False, plan: bool = False,
                 force: bool = False) -> Path:
    """Write a push-ready kernel folder: kernel-metadata.json (kaggle_kernel/kernel-metadata.json filled) and the
    parameterised notebook behind the install cell (kaggle_kernel/install_cell.py filled).

    `competition`, `model_source` and `machine_shape` default to `conf/kaggle` of the composed config ('' for
    none); `machine_shape` is written only for a GPU kernel. The install cell installs the lab with the extras
    a GPU kernel needs (`kernel_extras`: vllm, unsloth, bnb, from the config) unless `gpu_extra` is False (none);
    the dataset must hold their wheels. The run folder must lie inside /kaggle/working (`check_run_dir`); an override
    naming a path on this machine is refused (`local_paths`) unless `allow_local_paths`, then named in a warning.
    From an attached earlier kernel the install cell copies back only what this stage reads
    (`lab.plan.output_plan.stage_reads`) and its own resumable state (checkpoints/<stage>). `plan`: print the
    stage's planned output against kaggle.output_limit_gb and refuse one over it (`lab.plan.output_plan.check`).
    """
    import nbformat
    import papermill as pm

    from lab.plan import output_plan

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
    if local := local_paths(overrides):
        what = (f"{', '.join(local)}: a path on this machine, which the Kaggle kernel cannot read (it sees "
                f"{KAGGLE_INPUT}/<source>/..., {KAGGLE_WORKING} and LAB_ROOT/conf)")
        if not allow_local_paths:
            raise LabError(f"{what}; point it at the kernel's own files or pass --allow-local-paths")
        print(f"warning: {what}", file=sys.stderr)
    keys = {o.key_or_group for o in parse_overrides(overrides)}
    if run_name is not None:
        check_run_name(run_name)
    run_name = run_name or slug
    if "run_dir" not in keys:
        overrides.append(f"run_dir={check_run_dir(f'{KAGGLE_WORKING}/outputs/{run_name}')}")
    cfg = compose(overrides)  # fails here, with the key named, rather than on Kaggle
    run_dir = check_run_dir(cfg.run_dir)
    competition = _from_config(competition, cfg.kaggle.competition)
    model_source = _from_config(model_source, cfg.kaggle.model_source)
    if model_source:
        check_model_source(model_source)
    machine_shape = _from_config(machine_shape, cfg.kaggle.machine_shape) if enable_gpu else None
    if plan and name != PIPELINE:
        output_plan.check(cfg, name, force=True)

    src = _pipeline_notebook() if name == PIPELINE else str(project_root() / "notebooks" / f"{name}.ipynb")
    nb = pm.execute_notebook(src, None, parameters={"overrides": overrides}, prepare_only=True, progress_bar=False,
                             kernel_name="python3", language="python")
    for k in ("input_path", "output_path"):
        nb.metadata.get("papermill", {}).pop(k, None)
    extras = kernel_extras(cfg, name) if enable_gpu and gpu_extra else []
    package = DIST_NAME + (f"[{','.join(extras)}]" if extras else "")
    copy_back = None if name == PIPELINE else output_plan.stage_reads(cfg, name)
    resume = f"checkpoints/{name}" if name in output_plan.TRAINING else None
    install = nbformat.v4.new_code_cell(install_cell_source(dataset.split("/", 1)[1], run_dir, package,
                                                            str(cfg.kaggle.python_version), copy_back, resume,
                                                            cfg.kaggle.scratch_dir),
                                        metadata={"tags": [INSTALL_TAG]})
    nb.cells.insert(0, install)
    for cell in nb.cells:  # the cells made here get fixed ids, not random ones: the same build, the same files
        tags = cell.get("metadata", {}).get("tags", [])
        for tag in (INSTALL_TAG, "injected-parameters"):
            if tag in tags:
                cell["id"] = tag
    nbformat.validate(nb)

    out = owner.output_dir(resolve_path(out or f"{BUILD_DIR}/{name}"), "kaggle build", force)  # new, or its own
    code_file = f"{name}.ipynb"
    atomic_write_text(out / code_file, nbformat.writes(nb))
    meta = json.loads(template("kernel-metadata.json"))
    meta.update({"id": f"{user}/{slug}", "title": title, "code_file": code_file, "enable_gpu": bool(enable_gpu),
                 "dataset_sources": [dataset], "competition_sources": [competition] if competition else [],
                 "kernel_sources": list(kernel_sources), "model_sources": [model_source] if model_source else []})
    if machine_shape:
        meta["machine_shape"] = machine_shape
    atomic_write_json(out / "kernel-metadata.json", meta)
    return out


def chain_run_name() -> str:
    """A chain's run name when none is given: the date and time, as a local run's folder (conf/config.yaml)."""
    return datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def build_chain(stages: list[str], overrides: list[str] = (), username: str | None = None,
                run_name: str | None = None, out: str | os.PathLike | None = None, title_prefix: str = "Nemotron lab",
                **kw) -> list[Path]:
    """One kernel per stage of `stages` (in order), under `out` (default kaggle_kernel/build/chain-RUN), sharing one
    run folder (`run_name`, default the date and time: `chain_run_name`): each kernel attaches the one before it
    (`kernel_sources`), so its install cell copies back what it reads; 04_vote after a chain without 03_grpo votes
    with 02_sft's adapter (vote.adapter=${sft.adapter_dir}). Returns the kernel folders in push order."""
    if not stages:
        raise LabError("--chain: name the stages, e.g. --chain 01_explore,02_sft,04_vote")
    names = [_notebook_name(s) for s in stages]
    if PIPELINE in names or len(set(names)) != len(names):
        raise LabError(f"--chain {','.join(stages)}: each stage once, the pipeline kernel not among them")
    if names != sorted(names, key=STAGES.index):
        raise LabError(f"--chain {','.join(stages)}: stages must come in the pipeline's order ({', '.join(STAGES)})")
    user = _username(username)
    run_name = check_run_name(run_name or chain_run_name())
    root = owner.output_dir(resolve_path(out or f"{BUILD_DIR}/chain-{slugify(run_name) or 'run'}"),
                            "kaggle build --chain", kw.get("force", False))
    extra = list(overrides)
    keys = {o.key_or_group for o in parse_overrides(extra)}
    if "04_vote" in names and "03_grpo" not in names and "vote.adapter" not in keys:
        extra.append("vote.adapter=${sft.adapter_dir}")
    folders, previous = [], None
    for n in names:
        title = f"{title_prefix} {run_name} {n}"
        folders.append(build_kernel(n, extra, username=user, title=title, out=root / n, run_name=run_name,
                                    kernel_sources=[previous] if previous else [], **kw))
        previous = f"{user}/{_check_title(title, 'kernel', 5, 50)}"
    return folders


def push_commands(folders: list[Path]) -> list[str]:
    """`kaggle kernels push` for each kernel folder, in order, with its accelerator."""
    cmds = []
    for f in folders:
        meta = json.loads((Path(f) / "kernel-metadata.json").read_text())
        acc = ["--accelerator", meta["machine_shape"]] if meta.get("machine_shape") else []
        cmds.append(owner.quote_command("kaggle", "kernels", "push", "-p", f, *acc))
    return cmds


# ---- command line --------------------------------------------------------------------------------------------------

def plan_main(overrides: list[str], stages: list[str]) -> str:
    """`python -m lab kaggle plan OVERRIDES`: each stage's planned bytes in /kaggle/working and in scratch, with the
    arithmetic (`lab.plan.output_plan`), for a run inside /kaggle/working."""
    from lab.plan import output_plan

    keys = {o.key_or_group for o in parse_overrides(overrides)}
    extra = [] if "run_dir" in keys else [f"run_dir={KAGGLE_WORKING}/outputs/plan"]
    cfg = compose([*overrides, *extra])
    params = output_plan.trainable_params(cfg) if any(s != "01_explore" for s in stages) else 0
    reports = []
    for s in stages:
        plan = output_plan.planned_output_bytes(cfg, _notebook_name(s), params)
        reports.append(output_plan.report(plan))
    return "\n\n".join(reports)


def main(argv: list[str] | None = None) -> int:
    argv, extra = split_at_dashes(argv)
    ap = argparse.ArgumentParser(prog="python -m lab kaggle", description="offline Kaggle kernels and their dataset "
                                 "(quick start: kaggle_kernel/README.md)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    opts = argparse.ArgumentParser(add_help=False)  # what `build` and `run` share
    opts.add_argument("overrides", nargs="*", help="Hydra overrides baked into the notebooks, key=value words at "
                                                   "the end of the line")
    opts.add_argument("--username", help="your Kaggle username (default: $KAGGLE_USERNAME; one of the two is needed)")
    opts.add_argument("--run-name", help="run folder under /kaggle/working/outputs and part of each kernel's title "
                                         "(default: the kernel's slug; --chain: the date and time, as a local run)")
    opts.add_argument("--title", help="kernel title; its slug is the kernel id (default: 'Nemotron lab NAME'; "
                                      "--chain: the prefix, default 'Nemotron lab', + RUN + STAGE)")
    opts.add_argument("--out", help=f"folder to write (default: {BUILD_DIR}/NAME, --chain: {BUILD_DIR}/chain-RUN)")
    opts.add_argument("--competition", help="competition slug; '' for none (default: kaggle.competition)")
    opts.add_argument("--model-source", help="Kaggle Models handle owner/model/framework/instance/version; '' for "
                                             "none (default: kaggle.model_source in conf/kaggle/default.yaml)")
    opts.add_argument("--dataset", help=f"owner/slug of the dependency dataset (default: "
                                        f"USER/{slugify(DATASET_TITLE)})")
    opts.add_argument("--no-gpu", action="store_true", help="enable_gpu: false")
    opts.add_argument("--machine-shape", help="Kaggle machine_shape (accelerator) of a GPU kernel, e.g. "
                                              "NvidiaTeslaT4 (default: kaggle.machine_shape)")
    opts.add_argument("--no-gpu-extra", action="store_true", help="install the lab without vllm/unsloth (default: "
                                                                  "the extras the config needs, on a GPU kernel)")
    opts.add_argument("--allow-local-paths", action="store_true",
                      help="build even when an override names a path on this machine (named in a warning)")
    opts.add_argument("--force", action="store_true", help="write into --out even when it holds files the lab did "
                      "not make for `kaggle build` (refused otherwise)")
    opts.add_argument("--plan", action="store_true", help="print each stage's planned output (`kaggle plan`) and "
                                                          "refuse a plan over kaggle.output_limit_gb")
    b = sub.add_parser("build", parents=[opts],
                       help="a push-ready kernel folder for one notebook, a chain of them, or the pipeline",
                       epilog="examples: python -m lab kaggle build --notebook 02_sft --username me "
                              "experiment=competition | python -m lab kaggle build --chain 01_explore,02_sft,04_vote "
                              "--run-name comp1 --username me experiment=competition")
    which = b.add_mutually_exclusive_group(required=True)
    which.add_argument("--notebook", help=f"one of {', '.join(STAGES)} or {PIPELINE}")
    which.add_argument("--chain", help="comma-separated stages in order, one kernel each, each attaching the one "
                                       "before it (e.g. 01_explore,02_sft,04_vote)")
    b.add_argument("--kernel-sources", default="",
                   help="comma-separated kernels (owner/slug) whose output to attach; what this stage reads of their "
                        "outputs/<run_name> is copied back and the run continues (--chain sets it)")
    r = sub.add_parser("run", parents=[opts], help="build a chain, then push each kernel, wait for it and fetch its "
                       "output into the run folder before the next (needs Kaggle credentials; resumable)",
                       epilog="example: python -m lab kaggle run --chain 01_explore,02_sft,04_vote --run-name comp1 "
                              "--username me experiment=competition   (rerun the same command to resume)")
    r.add_argument("--chain", required=True, help="comma-separated stages in order (e.g. 01_explore,02_sft,04_vote)")
    r.add_argument("--run-dir", help="local folder for the kernels' outputs and the chain's state (default: "
                                     "outputs/RUN)")
    r.add_argument("--poll-s", type=float, default=30.0, help="first wait between status checks, growing by half "
                                                              "each check up to 10 min (default: %(default)s)")
    d = sub.add_parser("dataset", help="the dataset folder with the lab's wheel, conf/notebooks and requirements.txt")
    d.add_argument("--username", help="your Kaggle username (default: $KAGGLE_USERNAME)")
    d.add_argument("--title", default=DATASET_TITLE,
                   help="dataset title; its slug is the dataset id (default: %(default)s)")
    d.add_argument("--out", help=f"folder to write (default: {BUILD_DIR}/dataset)")
    d.add_argument("--force", action="store_true", help="write into --out even when it holds files the lab did not "
                                                        "make for `kaggle dataset` (refused otherwise)")
    d.add_argument("--license", default="other", help="Kaggle license name (default: %(default)s)")
    d.add_argument("--no-gpu-extra", action="store_true", help="leave the GPU extras (vllm, unsloth, torch pin) out")
    d.add_argument("--no-wheel", action="store_true", help="skip building the wheel (metadata and sources only)")
    d.add_argument("--files-from", help="a file listing the project files to pack, one path a line (default: what "
                                        "git tracks, `git ls-files`; needed outside a git checkout)")
    d.add_argument("--fetch-wheels", action="store_true",
                   help="then fill the folder with the dependency wheels (needs the package index): pip wheel for "
                        f"{', '.join(SDIST_ONLY)}, pip download --only-binary=:all: for the rest; prints them with "
                        "sizes")
    d.add_argument("--python-version", help="Kaggle's Python for --fetch-wheels (default: kaggle.python_version in "
                                            "conf/kaggle/default.yaml)")
    pl = sub.add_parser("plan", help="each stage's planned bytes in /kaggle/working and scratch, with the arithmetic",
                        epilog="example: python -m lab kaggle plan experiment=competition gpu=rtx_pro_6000")
    pl.add_argument("overrides", nargs="*", help="Hydra overrides")
    pl.add_argument("--stages", default=",".join(STAGES), help="comma-separated stages (default: all)")
    args = ap.parse_args(argv)
    if args.cmd == "plan":
        print(plan_main([*args.overrides, *extra], [s for s in args.stages.split(",") if s]))
    elif args.cmd in ("build", "run"):
        kw = dict(competition=args.competition, model_source=args.model_source, dataset=args.dataset,
                  enable_gpu=not args.no_gpu, machine_shape=args.machine_shape, gpu_extra=not args.no_gpu_extra,
                  allow_local_paths=args.allow_local_paths, plan=args.plan, force=args.force)
        overrides = [*args.overrides, *extra]
        if args.chain:
            if getattr(args, "kernel_sources", None):
                raise LabError("--chain sets each kernel's --kernel-sources itself")
            run_name = args.run_name or chain_run_name()
            folders = build_chain(args.chain.split(","), overrides, username=args.username, run_name=run_name,
                                  out=args.out, title_prefix=args.title or "Nemotron lab", **kw)
        else:
            folders = [build_kernel(args.notebook, overrides, username=args.username, title=args.title, out=args.out,
                                    run_name=args.run_name, kernel_sources=[k for k in args.kernel_sources.split(",")
                                                                            if k], **kw)]
        metas = [json.loads((f / "kernel-metadata.json").read_text()) for f in folders]
        ids = [m["id"] for m in metas]
        print("\n".join(f"wrote {f}: {m['code_file']} and kernel-metadata.json (id {m['id']})"
                        for f, m in zip(folders, metas)))
        if args.cmd == "run":
            from lab.kaggle.run import run_chain

            run_dir = resolve_path(args.run_dir or f"outputs/{run_name}")
            print(f"running the chain into {run_dir}; interrupted, it resumes with the same command"
                  + ("" if args.run_name else f" and --run-name {run_name}"))
            run_chain(folders, run_dir, poll_s=args.poll_s)
            print(f"done: each kernel's output is in {run_dir / 'kaggle'}")
            return 0
        cmds = push_commands(folders)
        if len(cmds) == 1:
            print(f"push it with: {cmds[0]}")
        else:
            print("push them in this order, each after the one before has finished (kaggle kernels status ID: "
                  "a kernel attaches the latest output of the one before it), or let `python -m lab kaggle run` "
                  "do it:")
            for i, (c, k) in enumerate(zip(cmds, ids), 1):
                print(f"  {i}. {c}    # then wait: {owner.quote_command('kaggle', 'kernels', 'status', k)}")
    else:
        if extra:
            raise LabError(f"`kaggle dataset` takes no overrides (got {extra})")
        files = None
        if args.files_from:
            lst = resolve_path(args.files_from)
            if not lst.is_file():
                raise LabError(f"--files-from {lst}: not found")
            files = [x.strip() for x in lst.read_text(encoding="utf-8").splitlines() if x.strip()]
        out = build_dataset(args.username, args.out, args.title, args.license, gpu_extra=not args.no_gpu_extra,
                            wheel=not args.no_wheel, files=files, force=args.force)
        if args.fetch_wheels:
            fetch_wheels(out, args.python_version)
        meta = json.loads((out / "dataset-metadata.json").read_text())
        todo = "" if args.fetch_wheels else ("fill it with wheels on a machine with internet (`python -m lab kaggle "
                                              "dataset --fetch-wheels`, kaggle_kernel/README.md), then: ")
        print(f"wrote {out} (id {meta['id']}): " + ", ".join(sorted(p.name for p in out.iterdir()))[:2000] +
              f"\nnext: {todo}{owner.quote_command('kaggle', 'datasets', 'create', '-p', out)}")
    return 0
