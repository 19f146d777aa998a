"""Every relative link in the README and the docs points at a file that exists and, with a `#fragment`, at a heading
that exists there (GitHub's anchor rule: lower case, punctuation dropped, spaces as hyphens)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    found, in_code = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (match := re.match(r"^#+\s+(.*)", line)):
            found.add(re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-"))
    return found


def test_anchor_rule_matches_githubs_on_known_headings():
    text = anchors(ROOT / "docs" / "benchmarks.md")
    assert "10-the-exchange-off-the-critical-path-exchange_mode-async" in text


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    broken = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, fragment = target.partition("#")
        destination = (path.parent / file) if file else path
        if not destination.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{path.relative_to(ROOT)}: {broken}"
