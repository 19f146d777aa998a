"""`trl-ftis --help`, `--version` and `keygen` start without importing torch, TRL or transformers (they took as
long as importing torch: 1.2 s idle, 4-5 s on a busy machine), and `from trl_ftis import ftis_loss` still works."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "trl", "peft", "accelerate", "datasets")

PROBE = """
import contextlib, io, json, sys
import trl_ftis.cli as cli
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    try:
        code = cli.main({argv})
    except SystemExit as exit:
        code = exit.code
print(json.dumps({{"code": code, "loaded": sorted(m for m in {heavy} if m in sys.modules)}}))
"""


@pytest.mark.parametrize(
    "argv", [["--version"], ["--help"], ["keygen", "--help"], ["keygen", "probe", "--dir", "KEYS"]]
)
def test_the_cli_starts_without_the_heavy_libraries(tmp_path, argv):
    argv = [str(tmp_path / "keys") if a == "KEYS" else a for a in argv]
    probe = PROBE.format(argv=argv, heavy=HEAVY)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["code"] in (0, None)
    assert report["loaded"] == []
    if argv[0] == "keygen" and "--help" not in argv:
        assert (tmp_path / "keys" / "probe.key").exists()


def test_the_package_still_exports_the_objective_on_first_use():
    probe = (
        "import sys, trl_ftis; print('torch' in sys.modules); from trl_ftis import ftis_loss, VARIANTS; "
        "print(callable(ftis_loss), bool(VARIANTS))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.split() == ["False", "True", "True"]


def test_the_warning_filter_loads_before_any_dependency():
    """Scripts call it before importing transformers, so that import-time notices are hidden too."""
    probe = (
        "import sys; from trl_ftis.dependency_warnings import quiet_dependency_warnings; quiet_dependency_warnings(); "
        f"print(sorted(m for m in {HEAVY} if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"
