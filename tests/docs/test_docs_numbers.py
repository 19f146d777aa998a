"""Numbers the guides quote from raw files are the raw files' numbers: the worked example of what joining was worth
(docs/when-it-pays.md, README), the wall-time experiment's record count and step ratio. The results page
(docs/benchmarks.md) holds each study's result tables; its per-study pages (docs/studies/) the setting and reading."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def results_and_studies() -> str:
    """The results page and every per-study page, one text."""
    pages = [ROOT / "docs" / "benchmarks.md", *sorted((ROOT / "docs" / "studies").glob("*.md"))]
    return "\n".join(page.read_text() for page in pages)


def console_lines(path: Path) -> set[str]:
    """The raw output's lines without the launcher's `[swarm]` prefix, whitespace collapsed."""
    return {" ".join(re.sub(r"^\[[\w-]+\]\s+", "", line).split()) for line in path.read_text().splitlines()}


def test_the_worked_example_is_the_recorded_demo_controls_run():
    raw = console_lines(RESULTS / "launcher-tiny-controls.txt")
    again = console_lines(RESULTS / "pays-launcher-tiny-controls.txt")
    guide = (ROOT / "docs" / "when-it-pays.md").read_text()
    example = guide[guide.index("**A worked example: `make demo-controls`**") :]
    block = example[example.index("```text\n") + 8 : example.index("```", example.index("```text\n") + 8)]
    quoted = [" ".join(line.split()) for line in block.splitlines() if line.strip()]
    shortened = [line for line in quoted if "(all measured)" in line]  # the factors, one line each in the output
    assert len(shortened) == 1
    for line in quoted:
        if line in shortened:
            factors = [part.strip() for part in line.split("(all measured)")[0].split(",")]
            assert len(factors) == 7  # f, s, r, q, g, t and the step ratio
            for factor in factors:
                assert any(known.startswith(f"{factor} ") for known in raw), factor
            continue
        assert line in raw, line
        assert line in again or line.startswith("joining, "), line  # `trl-ftis pays RUN_DIR` says the same
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "φ was 0.27 [−0.30, 1.46] for the big peer and −0.17 [−0.67, 0.29] for the small one" in readme
    assert "phi = 0.27 [-0.30, 1.46]" in " ".join(raw) and "phi = -0.17 [-0.67, 0.29]" in " ".join(raw)


def test_the_wall_time_experiments_quoted_counts_and_step_ratio():
    records = [json.loads(line) for line in (RESULTS / "peer_gain_wall-grid.jsonl").read_text().splitlines() if line]
    kinds = [record["kind"] for record in records]
    assert (kinds.count("checkpoint"), kinds.count("run"), kinds.count("warm")) == (3616, 32, 1)
    benchmarks = results_and_studies()
    assert "3,616 checkpoint records" in benchmarks and "3,649 snapshot" not in benchmarks
    summary = (RESULTS / "peer_gain_wall-grid.txt").read_text()
    assert "step_ratio: 1.069 [1.030, 1.108] over 8 seeds" in summary
    assert "step ratio swarm / A_N = 0.968" in summary
    guide = " ".join((ROOT / "docs" / "when-it-pays.md").read_text().split())
    assert "1.069 [1.030, 1.108]" in guide and "0.968" in guide


def summary_rows(path: Path, until: str | None = None) -> dict[str, str]:
    """A benchmark summary's table rows (before the line starting with `until`): first cell -> the next two cells
    joined as '<value> <interval>'."""
    rows = {}
    text = path.read_text()
    for line in (text[: text.index(until)] if until else text).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 3:
            rows[cells[0]] = f"{cells[1]} {cells[2]}"
    return rows


def test_the_emulated_regimes_quoted_ratios_are_the_summaries():
    guide = " ".join((ROOT / "docs" / "when-it-pays.md").read_text().split())
    benchmarks = " ".join((ROOT / "docs" / "benchmarks.md").read_text().split())
    readme = " ".join((ROOT / "README.md").read_text().split())
    one = summary_rows(RESULTS / "generation_bound-point1.txt")
    two = summary_rows(RESULTS / "generation_bound-point2.txt")
    names = ["wall time copy-2 / A_2", "wall time copy-2 / A_1", "seconds a step copy-2 / A_2", "steps copy-2 / A_2"]
    for rows in (one, two):
        for name in names:
            assert rows[name] in benchmarks, (name, rows[name])
    assert one["wall time copy-2 / A_1"] in guide and one["wall time copy-2 / A_1"] in readme
    assert two["wall time copy-2 / A_2"] in guide
    # the predictions beside them: "| copy-2 / A_1 (better alone) | 0.84 | [0.48, 1.19] | ..." in the summary
    assert one["copy-2 / A_1 (better alone)"] in guide and one["copy-2 / A_1 (better alone)"] in readme
    assert two["copy-2 / A_2 (better alone)"] in guide


def test_the_bigger_partners_quoted_differences_are_the_summarys():
    rows = summary_rows(RESULTS / "bigger_partner-grid.txt", until="Out of distribution")
    benchmarks = " ".join((ROOT / "docs" / "benchmarks.md").read_text().split())
    guide = " ".join((ROOT / "docs" / "when-it-pays.md").read_text().split())
    readme = " ".join((ROOT / "README.md").read_text().split())

    def typeset(text: str) -> str:  # the guides print minus signs
        return text.replace("-", "−")

    for name in ("f-tis - A_1", "f-tis - A_2", "nois - A_2", "f-tis - tis (the filter)",
                 "tis - nois (the truncation)", "partner in f-tis - partner-alone",
                 "partner in nois - partner-alone"):  # fmt: skip
        value, interval = typeset(rows[name]).split(" ", 1)
        assert f"| {value} | {interval} |" in benchmarks, (name, rows[name])  # its table row
    assert typeset(rows["f-tis - A_1"]) in guide and typeset(rows["f-tis - A_1"]) in readme
    assert typeset(rows["partner in f-tis - partner-alone"]) in guide
    assert typeset(rows["A_2 - A_1"]) in guide and typeset(rows["A_2 - A_1"]) in benchmarks
    assert typeset(rows["f-tis"]) in benchmarks  # phi and its interval
