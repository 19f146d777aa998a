"""The demo's plumbing: its swarm config is valid, results are collected and tabulated (no model runs here)."""

import json

from trl_ftis.demo.driver import FULL, QUICK, _peer_config, collect_results, own_rows_per_step
from trl_ftis.demo.report import assess, format_table
from trl_ftis.launcher import build_commands, load_swarm_config


def _commands(config, run_dir):
    return {c.id: " ".join(map(str, c.argv)) for c in build_commands(load_swarm_config(config, run_dir=run_dir))}


def test_the_demo_swarm_config_is_accepted_by_the_launcher_with_both_baselines(tmp_path):
    config = _peer_config(tmp_path, tmp_path / "base", None, FULL, baseline=True, seed=0)
    commands = _commands(config, tmp_path)
    assert set(commands) == {"full", "lora", "alone", "alone-rows"}
    assert "--use_peft true" in commands["lora"]
    assert all("--train_alone true" in commands[b] for b in ("alone", "alone-rows"))
    assert not any("--train_alone" in commands[p] for p in ("full", "lora"))
    assert all("--expected_peers full lora " in r + " " for r in commands.values())
    assert all(f"--max_completion_length {FULL['max_completion_length']}" in r for r in commands.values())
    assert all(f"--temperature {FULL['temperature']}" in r for r in commands.values())
    # Same own generation for the swarm peers and 'alone'; 'alone-rows' generates what a swarm peer trains on.
    own = FULL["prompts_per_step"] * FULL["num_generations"]
    rows = own_rows_per_step(load_swarm_config(config, run_dir=tmp_path))
    assert rows == {"full": own, "lora": own, "alone": own, "alone-rows": 2 * own}
    assert f"--gradient_accumulation_steps {2 * own}" in commands["alone-rows"]
    # Own prompts and samples per swarm peer (one seed would make full and lora trade duplicates); the baselines
    # share full's seed.
    seeds = {peer: commands[peer].split("--seed ")[1].split()[0] for peer in commands}
    assert seeds == {"full": "0", "lora": "1", "alone": "0", "alone-rows": "0"}
    assert QUICK["steps"] < FULL["steps"]


def test_the_small_peer_joins_the_swarm_and_the_rows_baseline_grows_with_it(tmp_path):
    config = _peer_config(tmp_path, tmp_path / "base", tmp_path / "small", FULL, baseline=True, seed=0)
    commands = _commands(config, tmp_path)
    assert set(commands) == {"full", "lora", "small", "alone", "alone-rows"}
    assert str(tmp_path / "small") in commands["small"]
    assert all("--expected_peers full lora small" in r for r in commands.values())
    own = FULL["prompts_per_step"] * FULL["num_generations"]
    assert own_rows_per_step(load_swarm_config(config, run_dir=tmp_path))["alone-rows"] == 3 * own
    without = _peer_config(tmp_path, tmp_path / "base", tmp_path / "small", FULL, baseline=False, seed=0)
    assert [p["id"] for p in without["peers"]] == ["full", "lora", "small"]


def test_results_are_collected_and_tabulated(tmp_path):
    def write(peer, **summary):
        (tmp_path / peer).mkdir()
        base = {
            "peer_id": peer,
            "steps": 4,
            "rows_sent": 32,
            "rows_received": 32,
            "rows_accepted": 32,
            "rows_filtered": 5,
            "accuracy_before": 0.4,
            "accuracy_curve": [[0, 0.4], [4, 0.5]],
            "model": "/x/smollm2",
            "lora": False,
        }
        (tmp_path / peer / "ftis_summary.json").write_text(json.dumps({**base, **summary}))
        history = [{"step": 1, "reward": 0.5, "loss": 0.1, "ftis/peer_rows_accepted": 8.0}, {"step": 2}]
        (tmp_path / peer / "log_history.json").write_text(json.dumps(history))

    write("full", accuracy_after=0.55)
    write("lora", accuracy_after=0.6, lora=True)
    write("alone", accuracy_after=0.5, rows_sent=0, rows_received=0, rows_accepted=0, rows_filtered=0)
    write("alone-rows", accuracy_after=0.45, rows_sent=0, rows_received=0, rows_accepted=0, rows_filtered=0)
    own = {"full": 8, "lora": 8, "alone": 8, "alone-rows": 16, "small": 8}
    results = collect_results(tmp_path, ["full", "lora", "alone", "alone-rows", "small"], own)
    assert results["small"] == {"error": "no summary (the peer did not finish)"}
    assert results["full"]["reward_curve"] == [(1, 0.5)]
    assert results["full"]["peer_row_curves"] == {
        "accepted": [(1, 8.0)], "filtered": [], "is_weight_mean": [], "is_weight_max": []
    }  # fmt: skip
    assert (results["full"]["own_rows_per_step"], results["full"]["rows_per_step"]) == (8, 16.0)  # 8 + 32 / 4
    assert results["alone-rows"]["rows_per_step"] == 16.0
    table = format_table(results, assess(results, 100))
    rows = {line.split()[0]: line for line in table.splitlines()[2:]}
    # full: change +0.150, vs alone +0.050, vs alone-rows +0.100; 2 SE = 2 sqrt((.24 + .2475) / 100) = 0.140
    assert "+0.150" in rows["full"] and "0.140" in rows["full"]
    assert "+0.050" in rows["full"] and "+0.100" in rows["full"]
    assert "+0.100" in rows["lora"] and "+0.150" in rows["lora"] and "LoRA smollm2" in rows["lora"]
    assert "+0.050" in rows["alone"] and "-0.050" in rows["alone-rows"]  # each baseline against the other
    assert "did not finish" in rows["small"]


def test_the_demo_says_plainly_whether_accuracy_moved_beyond_the_noise():
    results = {
        "full": {"accuracy_before": 0.4, "accuracy_after": 0.45},  # 2 SE at n=40: 0.22
        "alone": {"accuracy_before": 0.1, "accuracy_after": 0.6},
        "small": {"error": "no summary (the peer did not finish)"},
    }
    lines = assess(results, 40)["console"]
    assert lines[0].startswith("full") and "inside the noise" in lines[0] and "0.22" in lines[0]
    assert "standard error 0.110" in lines[0]  # sqrt((.24 + .2475) / 40) = 0.1104
    assert (
        "outside two standard errors" in lines[1] and lines[-2] == "Changed by more than two standard errors: alone."
    )
    quiet = assess({"full": results["full"]}, 40)["console"]
    assert "not a measurable learning effect" in quiet[-2]
    assert "nothing to compare" in quiet[-1]


def test_the_demo_says_whether_a_peer_and_a_baseline_can_be_told_apart():
    def finals(**after):
        return {peer: {"accuracy_before": 0.4, "accuracy_after": a} for peer, a in after.items()}

    # 2 SE of a difference of final accuracies 0.5 and 0.4 on 100 problems: 2 sqrt((.25 + .24) / 100) = 0.14
    close = finals(full=0.5, alone=0.4, **{"alone-rows": 0.45})
    assert "cannot rank them" in assess(close, 100)["console"][-1]
    apart = {**close, **finals(lora=0.7)}
    sentence = assess(apart, 100)["console"][-1]
    assert (
        sentence
        == "Final accuracies more than two standard errors apart: lora vs alone +0.300, lora vs alone-rows +0.250."
    )


def test_dependency_deprecation_warnings_are_hidden_ours_are_not():
    import warnings

    from trl_ftis.dependency_warnings import quiet_dependency_warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_dependency_warnings()
        warnings.warn_explicit("old", FutureWarning, "training_args.py", 1, module="transformers.training_args")
        warnings.warn_explicit("old", DeprecationWarning, "x.py", 1, module="trl.trainer.grpo_config")
        warnings.warn_explicit("ours", FutureWarning, "config.py", 1, module="trl_ftis.config")
        warnings.warn_explicit("user", UserWarning, "training_args.py", 1, module="transformers.training_args")
    assert [str(w.message) for w in caught] == ["ours", "user"]
