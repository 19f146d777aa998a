"""The README and the user docs are guides: they say what is and how to use it, never which commit or issue changed it
(history goes in `CHANGELOG.md`). Raw result files may carry a commit in their name; a link to one is not prose."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]  # the per-study pages of docs/studies too
NOT_PROSE = re.compile(r"https?://\S+|benchmarks/results/[\w./-]+|\]\(#[^)]*\)|PKCS #\d+|\b[Ee]d25519\b")
COMMIT = re.compile(r"(?<![\w-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
ISSUE = re.compile(r"\b[Ii]ssues? #?\d+|(?<![\w/&])#\d{1,5}\b|\b(PR|pull request) #?\d+")


def history_marks(text: str) -> list[str]:
    """The commit hashes and issue or pull-request numbers in `text`'s prose."""
    prose = NOT_PROSE.sub(" ", text)
    return [match.group(0) for pattern in (COMMIT, ISSUE) for match in pattern.finditer(prose)]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_a_user_page_names_no_commit_and_no_issue(page):
    marks = history_marks(page.read_text(encoding="utf-8"))
    assert marks == [], (
        f"{page.relative_to(ROOT)} carries history {marks}: say what is, and put history in CHANGELOG.md"
    )


def test_the_check_finds_commits_and_issues_but_not_file_names_or_anchors():
    assert history_marks("fixed in 4b89b0b (issue 22, see #13)") == ["4b89b0b", "issue 22", "#13"]
    assert history_marks("Run at 425d74e; PR #40") == ["425d74e", "PR #40"]
    clean = (
        "[raw](../benchmarks/results/make-test-fresh-clone-5bb0bc6.txt), [s](#16-the-gpu-check), 1.0e30, Ed25519, 2048"
    )
    assert history_marks(clean) == []
