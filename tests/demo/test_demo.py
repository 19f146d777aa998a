"""The demo's plumbing: its swarm config is valid, results are collected and tabulated (no model runs here)."""

import json

from trl_ftis.demo.driver import FULL, QUICK, _peer_config, collect_results, format_table
from trl_ftis.launcher import build_commands, load_swarm_config


def test_the_demo_swarm_config_is_accepted_by_the_launcher(tmp_path):
    config = _peer_config(tmp_path, tmp_path / "base", tmp_path / "small", FULL, baseline=True, seed=0)
    commands = {c.id: " ".join(map(str, c.argv)) for c in build_commands(load_swarm_config(config, run_dir=tmp_path))}
    assert set(commands) == {"full", "lora", "small", "alone"}
    rendered = commands.values()
    assert any("--use_peft true" in r for r in rendered) and any("--train_alone true" in r for r in rendered)
    assert all("--expected_peers full lora small" in r for r in rendered)
    assert all(
        f"--gradient_accumulation_steps {FULL['prompts_per_step'] * FULL['num_generations']}" in r for r in rendered
    )
    assert QUICK["steps"] < FULL["steps"]


def test_results_are_collected_and_tabulated(tmp_path):
    def write(peer, **summary):
        (tmp_path / peer).mkdir()
        base = dict(
            peer_id=peer,
            steps=3,
            rows_sent=24,
            rows_received=48,
            rows_accepted=48,
            rows_filtered=5,
            accuracy_before=0.4,
            accuracy_curve=[[0, 0.4], [3, 0.5]],
            model="/x/smollm2",
            lora=False,
        )
        (tmp_path / peer / "ftis_summary.json").write_text(json.dumps({**base, **summary}))
        (tmp_path / peer / "log_history.json").write_text(json.dumps([{"step": 1, "reward": 0.5, "loss": 0.1}]))

    write("full", accuracy_after=0.55)
    write("lora", accuracy_after=0.6, lora=True)
    write("alone", accuracy_after=0.5, rows_sent=0, rows_accepted=0, rows_filtered=0)
    results = collect_results(tmp_path, ["full", "lora", "alone", "small"])
    assert results["small"] == {"error": "no summary (the peer did not finish)"}
    assert results["full"]["reward_curve"] == [(1, 0.5)]
    table = format_table(results)
    assert "+0.050" in table and "+0.100" in table  # versus the alone baseline
    assert "LoRA smollm2" in table and "did not finish" in table


def test_the_demo_says_plainly_whether_accuracy_moved_beyond_the_noise():
    from trl_ftis.demo.driver import learning_verdict

    results = {
        "full": {"accuracy_before": 0.4, "accuracy_after": 0.45},  # 2 SE at n=40: 0.22
        "alone": {"accuracy_before": 0.1, "accuracy_after": 0.6},
        "small": {"error": "no summary (the peer did not finish)"},
    }
    lines = learning_verdict(results, 40)
    assert lines[0].startswith("full") and "inside the noise" in lines[0] and "0.22" in lines[0]
    assert "outside two standard errors" in lines[1] and lines[-1] == "Changed by more than two standard errors: alone."
    quiet = learning_verdict({"full": results["full"]}, 40)
    assert "not a measurable learning effect" in quiet[-1]


def test_dependency_deprecation_warnings_are_hidden_ours_are_not():
    import warnings

    from trl_ftis.demo import quiet_dependency_warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_dependency_warnings()
        warnings.warn_explicit("old", FutureWarning, "training_args.py", 1, module="transformers.training_args")
        warnings.warn_explicit("old", DeprecationWarning, "x.py", 1, module="trl.trainer.grpo_config")
        warnings.warn_explicit("ours", FutureWarning, "config.py", 1, module="trl_ftis.config")
        warnings.warn_explicit("user", UserWarning, "training_args.py", 1, module="transformers.training_args")
    assert [str(w.message) for w in caught] == ["ours", "user"]
