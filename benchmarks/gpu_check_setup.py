"""The GPU check's set-up: the wheels it carries to a bare GPU machine, and what it does with them there.

A lent GPU machine has Python, its own CUDA build of torch and transformers, and no network. What the trainer needs
beyond them, and what the machine may lack, is carried as wheels in `benchmarks/gpu_wheels/` (an ignored folder,
named in the device call's `carry` list), filled here, on a machine with an index:

    python benchmarks/gpu_check.py --prepare      # pip download --no-deps, at the versions of this environment

[`prepare`] downloads, without their dependencies, the wheels of [`CARRIED`] at the versions installed in the running
environment (the project's virtualenv): pure-Python wheels, plus `psutil`'s single abi3 wheel and one `multiprocess`
wheel per Python version, since the machine's Python version is not known in advance; about 4 MiB in all, checked
against [`MAX_BYTES`]. Where `pip download` cannot reach an index, a wheel is rebuilt from the installed files of the
distribution ([`wheel_from_installed`]).

On the machine, [`install`] puts the wheels whose distributions the machine lacks (and `trl` unless the machine has
exactly this version) into one folder with a single `pip install --no-deps --no-index --target` call (unzipped
directly when the machine's Python has no pip), which the check's processes then find first on `PYTHONPATH`; the
machine's torch and transformers are used as they are. DeepSpeed is not carried: PyPI has only a source package of
the version this project uses, and a binary-only download silently falls back to an unrelated 0.3 release.

`datasets` needs `pyarrow` and `pandas` (about 70 MiB of compiled wheels, for one Python version each), which cannot
travel in a 64 MiB call. TRL imports all three at module level but uses none of them on the path the check runs
(`datasets` for `isinstance` checks, `pandas` to log completion tables, `pyarrow` for sequence packing). Where one of
them cannot be imported after the installation, [`write_stand_ins`] writes a small stand-in module for it (their text
is [`STAND_INS`]), so that TRL imports; the check reports which stand-ins it used, and feeds the trainer a plain list
of prompts. Every function here uses the standard library only: this module runs before anything is installed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WHEEL_DIR = HERE / "gpu_wheels"
#: What the check needs beyond torch and transformers. accelerate: transformers' Trainer; datasets, dill,
#: multiprocess: TRL's imports (datasets' own); psutil: accelerate's and this project's. Not carried: pydantic (only
#: the swarm launcher's schema uses it), math-verify (the check's reward reads token ids), peft (optional to TRL).
CARRIED = ("trl", "accelerate", "datasets", "dill", "multiprocess", "psutil")
#: Installed unless the machine has exactly this version (the trainer subclasses TRL's); the other distributions are
#: installed only where the machine has none, or an older version, so that the machine's own versions stay in use.
EXACT = ("trl",)
#: Distributions published as one wheel per Python version (`py310`, `py311`, ...), all carried.
PER_PYTHON = {"multiprocess": ("3.10", "3.11", "3.12", "3.13")}
#: At most this much is carried (one device call carries 64 MiB, the repository included).
MAX_BYTES = 10 * 2**20
#: TRL's module-level imports that the check may stand in for, in the order they are tried.
STAND_IN_MODULES = ("pandas", "pyarrow", "datasets")

_ANY = '''
class _StandIn:
    """Anything of this module: using it raises, naming the module."""

    def __init__(self, *args, **kwargs):
        raise ImportError(f"{__name__} is a stand-in of the GPU check (benchmarks/gpu_check_setup.py)")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _StandIn
'''
#: The stand-in modules, by file (relative to the stand-in folder).
STAND_INS = {
    "pandas/__init__.py": '"""Stand-in for pandas (not installed): the GPU check logs no completion tables."""\n'
    + _ANY,
    "pyarrow/__init__.py": '"""Stand-in for pyarrow (not installed): the GPU check packs no sequences."""\n'
    + "from . import compute, types  # noqa: F401\n"
    + _ANY,
    "pyarrow/compute.py": '"""Stand-in for pyarrow.compute."""\n' + _ANY,
    "pyarrow/types.py": '"""Stand-in for pyarrow.types."""\n' + _ANY,
    "datasets/__init__.py": '''"""Stand-in for datasets (not importable here): rows in a list, as the GPU check's
trainer reads them."""

__version__ = "0+stand-in"


class Dataset:
    """Rows in a list: length, indexing, iteration and column names, what TRL's trainer reads of a dataset."""

    cache_files = []

    def __init__(self, rows=()):
        self._rows = list(rows)

    @classmethod
    def from_list(cls, rows):
        return cls(rows)

    @property
    def column_names(self):
        return list(self._rows[0]) if self._rows else []

    def __len__(self):
        return len(self._rows)

    def __getitem__(self, index):
        return self._rows[index]

    def __iter__(self):
        return iter(self._rows)


class IterableDataset:
    pass


class DatasetDict(dict):
    pass


class IterableDatasetDict(dict):
    pass


def load_dataset(*args, **kwargs):
    raise ImportError("datasets is a stand-in of the GPU check (benchmarks/gpu_check_setup.py)")
''',
}

WHEEL_NAME = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<python>[^-]+)-(?P<abi>[^-]+)-(?P<plat>.+)\.whl$"
)


# ---- names and tags -------------------------------------------------------------------------------------------------
def normalize(name: str) -> str:
    """A distribution's name as wheels and metadata compare it (PEP 503, with `_`)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def parse_wheel(filename: str) -> dict | None:
    """`name` (normalized), `version`, `python`, `abi`, `platform` tags of a wheel's file name; `None` otherwise."""
    match = WHEEL_NAME.match(filename)
    if not match:
        return None
    return {"file": filename, "name": normalize(match["name"]), "version": match["version"],
            "python": match["python"], "abi": match["abi"], "platform": match["plat"]}  # fmt: skip


def compatible(wheel: dict, version: tuple[int, int] = sys.version_info[:2], machine: str | None = None) -> bool:
    """Whether a wheel installs on CPython `version` on this (Linux) machine: python tag `py3`, `py3X` or `cp3X` with
    ABI `none`; `cp3X` with ABI `cp3X`; or ABI `abi3` built for this version or an earlier one; platform `any`, or a
    Linux platform of this machine's architecture."""
    major, minor = version
    tags = wheel["python"].split(".")
    if wheel["abi"] == "abi3":
        python_ok = any(t.startswith(f"cp{major}") and t[3:].isdigit() and int(t[3:]) <= minor for t in tags)
    elif wheel["abi"] == "none":
        python_ok = any(t in (f"py{major}", f"py{major}{minor}", f"cp{major}{minor}") for t in tags)
    else:
        python_ok = wheel["abi"] == f"cp{major}{minor}"
    arch = machine or platform.machine()
    plat = wheel["platform"]
    return python_ok and (plat == "any" or (sys.platform.startswith("linux") and "linux" in plat and arch in plat))


def version_key(version: str) -> tuple[int, ...]:
    """The leading numbers of a version (`"1.16.0rc1"` -> `(1, 16, 0)`): enough to tell older from newer here."""
    numbers = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if not digits:
            break
        numbers.append(int(digits.group()))
        if digits.group() != part:
            break
    return tuple(numbers)


def installed_version(name: str) -> str | None:
    """The version of distribution `name` in this interpreter's environment, `None` without one."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# ---- here: the wheels -----------------------------------------------------------------------------------------------
def wheel_from_installed(name: str, out: Path) -> Path:
    """A wheel of installed distribution `name` built from its files (`RECORD`) and its own `WHEEL` tags: what the
    preparation falls back on when `pip download` cannot reach an index."""
    dist = importlib.metadata.distribution(name)
    files = [f for f in dist.files or [] if "__pycache__" not in f.parts and not str(f).startswith("..")]
    info = next(f for f in files if f.parts[0].endswith(".dist-info"))
    wheel_text = Path(dist.locate_file(info.parts[0] + "/WHEEL")).read_text()
    tags = [line.split(":", 1)[1].strip() for line in wheel_text.splitlines() if line.startswith("Tag:")]
    tag = tags[0] if tags else "py3-none-any"
    path = out / f"{normalize(dist.metadata['Name'])}-{dist.version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in files:
            source = Path(dist.locate_file(file))
            if source.is_file():
                archive.write(source, str(file))
    return path


def prepare(out: Path = WHEEL_DIR, names: tuple[str, ...] = CARRIED, python: str = sys.executable) -> dict:
    """Fill `out` with the wheels of `names` at the versions installed here (see the module docstring); returns what it
    did, each wheel with its source (`pip download`, or `installed files` when that failed) and the total size."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.whl"):
        stale.unlink()
    report = {"folder": str(out), "wheels": [], "problems": []}
    for name in names:
        version = installed_version(name)
        if version is None:
            report["problems"].append(f"{name} is not installed here: nothing to carry")
            continue
        for python_version in PER_PYTHON.get(name, (None,)):
            command = [python, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                       "--dest", str(out), f"{name}=={version}"]  # fmt: skip
            if python_version:
                command[4:4] = ["--python-version", python_version]
            done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300)
            if done.returncode == 0:
                report["wheels"].append({"name": name, "version": version, "python": python_version,
                                         "source": "pip download"})  # fmt: skip
                continue
            if python_version not in (None, f"{sys.version_info[0]}.{sys.version_info[1]}"):
                report["problems"].append(f"{name}=={version} for Python {python_version}: not downloaded")
                continue
            wheel_from_installed(name, out)
            report["wheels"].append({"name": name, "version": version, "python": python_version,
                                     "source": "installed files (pip download failed)"})  # fmt: skip
    files = sorted(out.glob("*.whl"))
    report["files"] = [f.name for f in files]
    report["bytes"] = sum(f.stat().st_size for f in files)
    if report["bytes"] > MAX_BYTES:
        report["problems"].append(f"{report['bytes']} bytes of wheels: more than the {MAX_BYTES} the check carries")
    return report


# ---- there: the installation ----------------------------------------------------------------------------------------
def choose(wheel_dir: Path, version: tuple[int, int] = sys.version_info[:2]) -> dict:
    """What to install from `wheel_dir` here: per distribution, the compatible wheel if the distribution is missing or
    older (for [`EXACT`] ones: at another version); `{"install": [files], "kept": {name: version}, "unusable":
    [files]}`."""
    wheels = [w for w in map(parse_wheel, sorted(os.listdir(wheel_dir))) if w] if wheel_dir.is_dir() else []
    install, kept, unusable, seen = [], {}, [], set()
    for wheel in wheels:
        if not compatible(wheel, version):
            unusable.append(wheel["file"])
            continue
        name = wheel["name"]
        if name in seen:
            continue
        seen.add(name)
        present = installed_version(name)
        if present is None:
            keep = False
        elif name in EXACT:
            keep = present == wheel["version"]
        else:
            keep = version_key(present) >= version_key(wheel["version"])
        if keep:
            kept[name] = present
        else:
            install.append(wheel["file"])
    unusable = [f for f in unusable if parse_wheel(f)["name"] not in seen]  # another wheel of it was taken
    return {"install": install, "kept": kept, "unusable": unusable}


def install(wheel_dir: Path, target: Path, python: str = sys.executable, timeout: float = 120) -> dict:
    """Install the wheels [`choose`] picks into `target` with one `pip install --no-deps --no-index --target` call
    (unzipped directly where this Python has no pip). Returns the record the report shows: `status` (`ok`,
    `skipped`: nothing to install, `failed`), the files, what the machine already had, seconds."""
    began = time.time()
    chosen = choose(wheel_dir)
    record = {"wheel_dir": str(wheel_dir), "target": str(target), **chosen}
    if not chosen["install"]:
        reason = "no wheels here" if not wheel_dir.is_dir() or not any(wheel_dir.glob("*.whl")) else "all present"
        return record | {"status": "skipped", "reason": reason, "seconds": round(time.time() - began, 1)}
    target.mkdir(parents=True, exist_ok=True)
    files = [str(wheel_dir / f) for f in chosen["install"]]
    has_pip = subprocess.run([python, "-m", "pip", "--version"], check=False, capture_output=True).returncode == 0
    if has_pip:
        command = [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--disable-pip-version-check",
                   "--no-compile", "--upgrade", "--target", str(target), *files]  # fmt: skip
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=timeout)
        record.update(method="pip install --no-deps --no-index --target", exit=done.returncode)
        if done.returncode != 0:
            record.update(status="failed", reason=(done.stderr or done.stdout).strip()[-1500:])
            return record | {"seconds": round(time.time() - began, 1)}
    else:
        for file in files:
            with zipfile.ZipFile(file) as archive:
                archive.extractall(target)
        record.update(method="unzipped (this Python has no pip)")
    return record | {"status": "ok", "seconds": round(time.time() - began, 1)}


def missing_modules(env: dict, python: str = sys.executable, modules=STAND_IN_MODULES, timeout: float = 120) -> dict:
    """Which of `modules` cannot be imported with `env` (one child process): `{module: error}`."""
    code = (
        "import importlib, json, sys\nbad = {}\n"
        f"for name in {list(modules)!r}:\n"
        "    try:\n        importlib.import_module(name)\n"
        "    except Exception as error:\n        bad[name] = f'{type(error).__name__}: {error}'[:300]\n"
        "print(json.dumps(bad))\n"
    )
    done = subprocess.run([python, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {name: f"the import check failed: {done.stderr.strip()[-300:]}" for name in modules}
    return json.loads(lines[-1])


def write_stand_ins(folder: Path, modules) -> list[str]:
    """Write the stand-ins of `modules` (names of [`STAND_IN_MODULES`]) into `folder`; returns the files written."""
    if folder.exists():
        shutil.rmtree(folder)
    written = []
    for relative, text in STAND_INS.items():
        if relative.split("/")[0] in modules:
            path = folder / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(relative)
    return written


def set_up(work: Path, wheel_dir: Path = WHEEL_DIR, src: Path = HERE.parent / "src", force=(), timeout=60) -> dict:
    """The whole set-up on the machine: install the wheels into `work/site`, then stand-ins for what still cannot be
    imported (and for the modules in `force`, to rehearse a bare machine) into `work/stand-ins`, each of the two steps
    within `timeout` seconds. Returns the record, with `pythonpath` (stand-ins, site, the repository's `src`) for the
    check's processes."""
    record = {"install": install(wheel_dir, work / "site", timeout=timeout)}
    site = work / "site"
    path = [str(site)] if site.is_dir() else []
    path.append(str(src))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [*path, os.environ.get("PYTHONPATH")])))
    missing = missing_modules(env, timeout=timeout)
    for name in force:
        missing.setdefault(name, "a stand-in on request (--stand-ins)")
    stand_ins = work / "stand-ins"
    # datasets needs pandas and pyarrow: once one of them stands in, datasets does too.
    if missing and set(missing) & {"pandas", "pyarrow"}:
        missing.setdefault("datasets", "stands in because pandas or pyarrow does")
    record["stand_ins"] = {"modules": missing, "files": write_stand_ins(stand_ins, missing)}
    if missing:
        path.insert(0, str(stand_ins))
    record["pythonpath"] = path
    record["status"] = "failed" if record["install"]["status"] == "failed" else "ok"
    return record


def main() -> int:
    """`python benchmarks/gpu_check_setup.py [FOLDER]`: [`prepare`] into FOLDER (default `benchmarks/gpu_wheels`)."""
    report = prepare(Path(sys.argv[1]) if len(sys.argv) > 1 else WHEEL_DIR)
    print(json.dumps(report, indent=2))
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
