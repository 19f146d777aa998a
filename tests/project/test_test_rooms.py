"""The tests are laid out as the source is: every test module sits in a room (`tests/core`, `tests/swarm`, ...), and
only shared fixtures and helpers stay at `tests/` root."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
ROOMS = {
    "benchmarks",
    "core",
    "demo",
    "docs",
    "examples",
    "exchange",
    "launcher",
    "processes",
    "project",
    "swarm",
    "tasks",
}


def stray_test_modules(tests: Path) -> list[str]:
    """Test modules at the root of `tests` or in a folder that is no room."""
    stray = [path.name for path in tests.glob("test_*.py")]
    stray += [
        str(path.relative_to(tests))
        for path in tests.glob("*/**/test_*.py")
        if path.relative_to(tests).parts[0] not in ROOMS
    ]
    return sorted(stray)


def test_no_test_module_outside_a_room():
    assert stray_test_modules(TESTS) == []


def test_a_test_module_at_the_root_or_in_no_room_is_named(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "scratch").mkdir()
    for path in ("test_loose.py", "core/test_kept.py", "scratch/test_lost.py", "swarm_helpers.py"):
        (tmp_path / path).write_text("")
    assert stray_test_modules(tmp_path) == ["scratch/test_lost.py", "test_loose.py"]
