"""benchmarks/peer_gain_wall.py --summary-only reads the committed records and builds nothing: no warm model, no
training, no evaluation (each of which takes minutes)."""

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def wall(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import peer_gain_wall

    def refuse(*args, **kwargs):
        raise AssertionError("--summary-only built or trained something")

    for name in ("warm_model", "run_slot", "evaluate_pending"):
        monkeypatch.setattr(peer_gain_wall, name, refuse)
    return peer_gain_wall


@pytest.mark.parametrize("stage", ["grid", "pilot"])
def test_summary_only_summarises_the_records_without_building_anything(wall, monkeypatch, tmp_path, capsys, stage):
    cache = tmp_path / "cache"
    monkeypatch.setattr(sys, "argv", ["peer_gain_wall.py", "--stage", stage, "--summary-only", "--cache", str(cache)])
    wall.main()
    out = capsys.readouterr().out
    assert out.startswith("warm accuracy ") and "seed " in out
    assert not cache.exists()  # not even the warm model's folder
