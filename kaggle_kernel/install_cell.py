# Offline setup, the first cell of every kernel `python -m lab kaggle build` writes (template: kaggle_kernel/install_cell.py;
# the builder, lab/kaggle/kernel.py `install_cell_source`, fills the block between the two FILLED markers). A Kaggle
# competition kernel has no internet access, so this cell:
# 1. stops when the image's Python is not the one the wheel dataset was built for (kaggle.python_version);
# 2. installs the lab and its pinned dependencies from the attached dependency dataset, and the fused Mamba kernels'
#    wheels when the dataset holds them;
# 3. unpacks the lab's conf/, notebooks/ and scripts/ to LAB_ROOT;
# 4. when an earlier kernel's output with this run is attached (--kernel-sources), copies back only what this stage
#    reads (COPY_BACK, paths inside the run folder) into RUN_DIR, and a stopped stage's resumable state (RESUME) into
#    the scratch folder where the stage looks for its checkpoints;
# 5. records when the kernel started (LAB_KERNEL_START), so a training stage's wall-clock budget counts from here.
import glob
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import time

# ---- FILLED by `python -m lab kaggle build` (these values are the template's defaults) ----
LAB_DATASET = "nemotron-reasoning-lab-deps"
RUN_DIR = "/kaggle/working/outputs/run"
PACKAGE = "nemotron-reasoning-lab"
PYTHON_VERSION = None  # "3.12": stop on another Python; None: no check
COPY_BACK = None  # paths inside the run folder this stage reads; None: the whole earlier run (checkpoints excepted)
RESUME = None  # "checkpoints/<stage>": a stopped stage's state, copied to the scratch folder
RUN_MARKER = ".lab-run"  # the run folder's marker (lab.core.owner): copied back with COPY_BACK, the same run continues
SCRATCH_DIR = "/kaggle/temp"
KAGGLE_INPUT = "/kaggle/input"
KAGGLE_WORKING = "/kaggle/working"
LAB_ROOT = "/tmp/lab_root"
WHEEL_GLOB = "nemotron_reasoning_lab-*.whl"
MAMBA_WHEEL_GLOBS = ["causal_conv1d-*.whl", "mamba_ssm-*.whl"]
MAMBA_EXTRA_DEP = "einops==0.8.2"
SRC_TARBALL = "lab_src.tar.gz"
# ---- end of FILLED ----

os.environ.setdefault("LAB_KERNEL_START", str(time.time()))
_py = "%d.%d" % sys.version_info[:2]
if PYTHON_VERSION is not None and _py != PYTHON_VERSION:
    raise RuntimeError("this image runs Python " + _py + ", but the kernel and its wheel dataset were built for "
                       + PYTHON_VERSION + " (kaggle.python_version): rebuild the dataset with `python -m lab kaggle "
                       "dataset --fetch-wheels --python-version " + _py + "` (and scripts/build_mamba_wheels.sh with "
                       "PYTHON_VERSION=" + _py + "), then the kernel with kaggle.python_version=" + _py)

_wheels = (sorted(glob.glob(KAGGLE_INPUT + "/" + LAB_DATASET + "/" + WHEEL_GLOB))
           or sorted(glob.glob(KAGGLE_INPUT + "/**/" + WHEEL_GLOB, recursive=True)))
if not _wheels:
    raise FileNotFoundError("no " + WHEEL_GLOB + " under " + KAGGLE_INPUT + ": attach the dataset " + LAB_DATASET
                            + " (built by `python -m lab kaggle dataset`)")
LAB_DEPS = os.path.dirname(_wheels[-1])
subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", LAB_DEPS,
                PACKAGE], check=True)
_mamba = [w for g in MAMBA_WHEEL_GLOBS for w in sorted(glob.glob(os.path.join(LAB_DEPS, g)))[-1:]]
if _mamba:  # scripts/build_mamba_wheels.sh: no deps resolved (tilelang, quack-kernels are optional), einops is imported
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--find-links", LAB_DEPS, "--no-deps",
                    *_mamba, MAMBA_EXTRA_DEP], check=True)
importlib.invalidate_caches()

_src = os.path.join(LAB_DEPS, SRC_TARBALL)
if os.path.isfile(_src):
    with tarfile.open(_src) as _t:
        try:
            _t.extractall(LAB_ROOT, filter="data")
        except TypeError:  # Python without extraction filters
            _t.extractall(LAB_ROOT)
else:  # Kaggle unpacked the archive into a folder
    _conf = sorted(glob.glob(LAB_DEPS + "/**/conf/config.yaml", recursive=True))
    if not _conf:
        raise FileNotFoundError("neither " + SRC_TARBALL + " nor conf/config.yaml in " + LAB_DEPS)
    LAB_ROOT = os.path.dirname(os.path.dirname(_conf[0]))
os.environ["LAB_ROOT"] = LAB_ROOT


def _copy(src, dst):
    """Copy a file or folder from the read-only input mount: contents only (shutil.copyfile), so the copies are
    writable files of this kernel and not read-only like their source."""
    if not os.path.isdir(src):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src, dst)
        return
    for _root, _dirs, _files in os.walk(src):
        _to = os.path.join(dst, os.path.relpath(_root, src))
        os.makedirs(_to, exist_ok=True)
        for _f in _files:
            shutil.copyfile(os.path.join(_root, _f), os.path.join(_to, _f))


if RUN_DIR.startswith(KAGGLE_WORKING + "/"):
    _run = os.path.relpath(RUN_DIR, KAGGLE_WORKING)
    for _prev in sorted(glob.glob(KAGGLE_INPUT + "/*/" + _run)):
        _names = [RUN_MARKER, *COPY_BACK] if COPY_BACK is not None else [n for n in sorted(os.listdir(_prev)) if n != "checkpoints"]
        _found = [n for n in _names if os.path.exists(os.path.join(_prev, n))]
        print("continuing the run in", _prev, "| copying back:", ", ".join(_found) or "nothing")
        for _name in _found:
            _copy(os.path.join(_prev, _name), os.path.join(RUN_DIR, _name))
        if RESUME is not None and os.path.isdir(os.path.join(_prev, RESUME)):
            _dst = os.path.join(SCRATCH_DIR, _run, RESUME)
            print("resumable state", os.path.join(_prev, RESUME), "->", _dst)
            _copy(os.path.join(_prev, RESUME), _dst)
print("lab installed from", LAB_DEPS, "| LAB_ROOT =", LAB_ROOT, "| run_dir =", RUN_DIR)
