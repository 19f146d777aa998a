"""Every Python line in the repository fits the line length ruff is configured with (pyproject.toml's `[tool.ruff]`
`line-length`), checked without ruff, so that a long line fails the tests and not only the linter.

The lines ruff's E501 lets through are let through here too: a line that is one token (no whitespace inside, such as
a long regular expression or an f-string with no spaces), a line that ends with a URL starting within the limit, and
a line whose code fits once its trailing pragma comment (`# noqa`, `# type:`, ...) is left out.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("src", "tests", "examples", "benchmarks")
# The pragma comments ruff measures a line without (its `is_pragma_comment`).
PRAGMA = re.compile(r"#\s*(?:noqa\b|type:|pyright:|pylint:|nosec\b|isort:|ruff:|mypy:|fmt:)")


def configured_line_length(pyproject: str) -> int:
    """The `line-length` of the `[tool.ruff]` table (a plain scan: `tomllib` needs Python 3.11)."""
    section = None
    for raw in pyproject.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("[") and line.endswith("]"):
            section = line.strip("[]").strip()
        elif section == "tool.ruff" and line.startswith("line-length"):
            return int(line.split("=", 1)[1])
    raise AssertionError("pyproject.toml's [tool.ruff] sets no line-length")


def too_long(line: str, limit: int) -> bool:
    """Whether ruff's E501 would report `line` with this limit."""
    if len(line) <= limit:
        return False
    chunks = line.split()
    if len(chunks) < 2:
        return False
    if "://" in chunks[-1] and len(line) - len(chunks[-1]) <= limit:
        return False
    pragma = PRAGMA.search(line)
    return not (pragma and len(line[: pragma.start()].rstrip()) <= limit)


def long_lines(limit: int) -> list[str]:
    """`file:line (width)` of every line over the limit in the checked folders' Python files."""
    found = []
    for folder in CHECKED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if too_long(line, limit):
                    found.append(f"{path.relative_to(ROOT)}:{number} ({len(line)} characters)")
    return found


def test_the_limit_is_read_from_the_ruff_table():
    pyproject = "[project]\nline-length = 5\n\n[tool.ruff]\ntarget-version = 'py310'\nline-length = 88  # ours\n"
    assert configured_line_length(pyproject) == 88
    with pytest.raises(AssertionError, match="no line-length"):
        configured_line_length("[project]\nline-length = 5\n")


@pytest.mark.parametrize(
    ("line", "reported"),
    [
        ("x = 1  # " + "a" * 20, True),
        ("    " + "a" * 30, False),  # one token
        ("# see https://example.org/" + "a" * 20, False),  # a URL starting within the limit
        ("# " + "b" * 20 + " https://example.org/x", True),  # a URL starting past it
        ("x = 1  # noqa: E501 " + "c" * 20, False),  # the code before the pragma fits
        ("x = " + "d" * 20 + "  # type: ignore", True),  # the code before the pragma does not
        ("x = 1  # " + "e" * 10, False),
    ],
)
def test_the_check_reports_what_ruff_reports(line, reported):
    assert too_long(line, 20) is reported


def test_no_python_line_is_longer_than_the_configured_limit():
    limit = configured_line_length((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    found = long_lines(limit)
    assert not found, f"lines over {limit} characters (wrap them):\n" + "\n".join(found)
