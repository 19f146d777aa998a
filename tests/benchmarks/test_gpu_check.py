"""benchmarks/gpu_check.sh, gpu_check.py, gpu_check_setup.py and gpu_check_worker.py: the figures' math by hand, the
wheels (which ones a machine gets, an installation into a target folder, a wheel rebuilt from installed files), the
time plan of the GPU mode, the launcher stage's swarm config and result, the dry run end to end on the CPU with the
stand-ins a bare GPU machine would use (default suite), and SmolLM2-135M's shape on the CPU (`slow`)."""

import argparse
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check
import gpu_check_setup as setup

PARTS = gpu_check.TIME_PARTS


def run_check(*args, timeout):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    command = ["bash", str(SCRIPT), *map(str, args)]
    return subprocess.run(command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def step(total, generation, scoring, exchange, training, peer_rows=0.0):
    other = total - generation - scoring - exchange - training
    return {"step": total, "generation": generation, "scoring": scoring, "exchange": exchange, "training": training,
            "other": other, "peer_rows": peer_rows}  # fmt: skip


# ---- the figures, by hand -------------------------------------------------------------------------------------------
def test_the_step_split_sums_the_steps_after_the_first_then_divides():
    steps = [step(9.0, 8.0, 0.1, 0.0, 0.8), step(2.0, 1.0, 0.1, 0.2, 0.6, 64), step(4.0, 3.0, 0.1, 0.2, 0.6, 62)]
    split = gpu_check.step_split(steps)  # the first (warm-up) step left out
    assert split["steps"] == 2 and split["seconds_per_step"] == pytest.approx(3.0)
    assert split["shares"]["generation"] == pytest.approx(4.0 / 6.0) == split["f"]  # (1 + 3) / (2 + 4), not the mean
    assert split["shares"]["exchange"] == pytest.approx(0.4 / 6.0)
    assert sum(split["shares"].values()) == pytest.approx(1.0)
    assert split["peer_rows_per_step"] == pytest.approx(63.0)
    assert gpu_check.step_split(steps, skip_first=False)["steps"] == 3
    assert gpu_check.step_split(steps[:1])["steps"] == 1  # the only step is kept
    assert gpu_check.step_split([]) is None
    assert gpu_check.step_split([{"step": "nan"}]) is None  # a non-finite step (recorded as text) is no step


def test_generation_scaling_compares_seconds_with_rows():
    record = {"new_tokens": 256, "seconds": {"64": [2.0, 2.2], "128": [2.2], "256": [4.2]}}
    got = gpu_check.generation_scaling(record)
    assert got["seconds"] == pytest.approx({64: 2.1, 128: 2.2, 256: 4.2})
    assert got["ratio_to_smallest"] == pytest.approx({64: 1.0, 128: 2.2 / 2.1, 256: 2.0})
    assert got["rows_over_smallest"] == {64: 1.0, 128: 2.0, 256: 4.0}
    assert got["tokens_per_second"][256] == pytest.approx(256 * 256 / 4.2)
    assert gpu_check.generation_scaling({"new_tokens": 8, "seconds": {}}) is None


def test_a_swarm_peer_is_compared_with_the_alone_trainer_on_the_same_own_rows():
    alone = gpu_check.step_split([step(1.0, 0.5, 0, 0, 0.5), step(2.0, 1.5, 0, 0, 0.5)])
    peers = {"a": gpu_check.step_split([step(1, 1, 0, 0, 0), step(3.0, 1.5, 0, 0.5, 1.0, 64)]),
             "b": gpu_check.step_split([step(1, 1, 0, 0, 0), step(2.0, 1.0, 0, 0.2, 0.8, 60)])}  # fmt: skip
    got = gpu_check.swarm_against_alone(alone, peers, own_rows=64)
    assert got["peers"]["a"]["step_over_alone"] == pytest.approx(1.5)
    assert got["step_over_alone"] == pytest.approx((1.5 + 1.0) / 2)
    assert got["alone_rows_per_second"] == pytest.approx(32.0)
    assert got["swarm_rows_per_second"] == pytest.approx(128 / 3.0 + 124 / 2.0)
    assert gpu_check.swarm_against_alone(None, peers, 64) is None


def test_the_gpu_plan_fits_one_device_call_with_room_for_a_second():
    plan = gpu_check.MODES["gpu"]
    # About five minutes, set-up included; the documented device call gives it 360 s (timeout_s), out of 15 minutes.
    assert plan["budget"] <= 300 and plan["budget"] + 60 <= 360
    # Even with the set-up at its limit, every stage still gets its reserve.
    assert plan["caps"]["setup"] + gpu_check.RESERVE * len(gpu_check.STAGES) <= plan["budget"]
    order = list(gpu_check.STAGES)
    # A stage's limit is its cap while the budget lasts, less what the later stages keep.
    assert gpu_check.stage_timeout(plan["caps"], order, "fp32", 500) == plan["caps"]["fp32"]
    assert gpu_check.stage_timeout(plan["caps"], order, "fp32", 100) == 100 - 5 * gpu_check.RESERVE
    assert gpu_check.stage_timeout(plan["caps"], order, "zero3", 30) == 30
    assert gpu_check.stage_timeout(plan["caps"], order, "bf16", 10) == 0
    # The real shape: SmolLM2-135M's config, tied embeddings, its vocabulary; the row counts the question asks about.
    shape = plan["shape"]
    assert (shape["hidden_size"], shape["num_hidden_layers"], shape["num_attention_heads"]) == (576, 30, 9)
    assert (shape["num_key_value_heads"], shape["intermediate_size"], shape["vocab_size"]) == (3, 1536, 49152)
    assert shape["tie_word_embeddings"] and plan["generation"]["rows"] == [64, 128, 256]
    assert gpu_check.STAGES.index("fp32") < gpu_check.STAGES.index("bf16")  # fp32 first
    # The launcher stage runs after the trainer's own stages, before ZeRO-3; every mode gives every stage a cap.
    assert order[-2:] == ["launcher", "zero3"]
    for mode in gpu_check.MODES.values():
        assert set(mode["caps"]) == {"setup", *gpu_check.STAGES}
        # Two peers' shares fit one GPU with room for two CUDA contexts; each one's vLLM engine takes at most half
        # its share (the engine allocates inside the peer's cap: the rest trains).
        share, engine = mode["launcher"]["gpu_share"], mode["launcher"]["vllm_gpu_memory_utilization"]
        assert len(gpu_check.PEERS) * share <= 0.9 and engine <= share / 2
    assert plan["caps"]["launcher"] >= 60  # the launcher's start, two peers' start-ups (each a vLLM engine's), 2 steps


def test_the_launcher_stage_writes_a_swarm_config_the_launcher_accepts(tmp_path):
    """Two peers pinned to one GPU with their shares; vLLM colocated only when asked; loaded by the real launcher's
    schema (the peer script's options read from its source), the commands it would run."""
    from trl_ftis.launcher import SwarmConfigError, build_commands, load_swarm_config

    plan = gpu_check.MODES["gpu"]["launcher"]
    records = {name: tmp_path / f"launcher-{name}.json" for name in gpu_check.PEERS}
    common = {"gpu": "0", "spec": tmp_path / "spec.json", "exchange": tmp_path / "exchange", "records": records}
    config = gpu_check.swarm_config(plan, device="cuda", use_vllm=True, **common)
    assert config["script"] == str(gpu_check.PEER_SCRIPT) and config["exchange_url"] == f"dir://{tmp_path}/exchange"
    assert config["args"]["expected_peers"] == ["peer-a", "peer-b"] and config["args"]["use_cpu"] is False
    assert config["args"]["per_device_train_batch_size"] * config["args"]["gradient_accumulation_steps"] == 16
    assert config["args"]["use_vllm"] is True and config["args"]["vllm_mode"] == "colocate"
    assert config["args"]["vllm_gpu_memory_utilization"] == 0.2 < config["peers"][0]["gpu_share"] == 0.45
    assert [(p["id"], p["gpus"], p["args"]["seed"]) for p in config["peers"]] == [
        ("peer-a", "0", 0),
        ("peer-b", "0", 1),
    ]
    path = tmp_path / "swarm.yaml"
    path.write_text(gpu_check.config_text(config))
    loaded = load_swarm_config(path, run_dir=tmp_path / "run")
    assert [peer.args["gpu_memory_fraction"] for peer in loaded.peers] == [0.45, 0.45]
    commands = build_commands(loaded)
    assert [c.env["CUDA_VISIBLE_DEVICES"] for c in commands] == ["0", "0"]
    argv = commands[1].argv
    assert argv[1] == str(gpu_check.PEER_SCRIPT) and argv[argv.index("--peer_id") + 1] == "peer-b"
    assert (
        argv[argv.index("--gpu_memory_fraction") + 1] == "0.45" and argv[argv.index("--vllm_mode") + 1] == "colocate"
    )
    assert argv[argv.index("--check_result") + 1] == str(records["peer-b"])
    # The launcher reads the peer script's options from its source: a misspelt one is refused before anything starts.
    path.write_text(gpu_check.config_text({**config, "args": {**config["args"], "check_spce": "x"}}))
    with pytest.raises(SwarmConfigError, match=r"`args.check_spce` \(gpu_check_peer.py takes the fields of "
                       r"CheckPeerArguments, FTISConfig\); did you mean `args.check_spec`"):  # fmt: skip
        load_swarm_config(path, run_dir=tmp_path / "run")
    # Without vLLM (no CUDA, or no vLLM that imports) nothing of it is asked for, and the CPU is the device.
    config = gpu_check.swarm_config(plan, device="cpu", use_vllm=False, **common)
    assert config["args"]["use_vllm"] is False and config["args"]["use_cpu"] is True
    assert not [key for key in config["args"] if key.startswith("vllm_")]


def test_the_launcher_stage_fails_naming_the_peer_that_fell_short():
    def record(steps, accepted, received=16, peers=("peer-a", "peer-b"), errors=()):
        return {"generation": "trainer (transformers generate)", "cuda_visible_devices": "0",
                "gpu_memory_fraction": 0.45, "errors": list(errors),
                "memory": {"device": "cuda", "max_allocated_gib": 1.5, "max_reserved_gib": 2.0, "cap_gib": 35.6,
                           "gpu_total_gib": 79.1, "gpu_in_use_at_end_gib": 5.1},
                "trainer": {"global_step": steps, "steps": [step(2.0, 1.0, 0, 0.1, 0.9, 8)] * steps},
                "summary": {"rows_sent": 16, "rows_received": received, "rows_accepted": accepted,
                            "peers": list(peers)}}  # fmt: skip

    ok = gpu_check.launcher_result({"exit": 0}, {"peer-a": record(2, 13), "peer-b": record(2, 15)}, steps=2)
    assert ok["status"] == "ok" and "reason" not in ok
    assert ok["peers"]["peer-a"]["from"] == ["peer-b"] and ok["peers"]["peer-b"]["rows_accepted"] == 15
    assert ok["peers"]["peer-a"]["seconds_per_step"] == pytest.approx(2.0)
    assert ok["processes"]["peer-b"]["record"]["trainer"]["global_step"] == 2  # the raw record kept
    lines = gpu_check.launcher_lines({**ok, "gpus": "0", "gpu_share": 0.45, "vllm": "colocated",
                                      "vllm_gpu_memory_utilization": 0.2})  # fmt: skip
    assert lines[0] == ("    trl-ftis swarm: 2 peers on GPU 0, gpu_share 0.45 each; a colocated vLLM engine each "
                        "(vllm_gpu_memory_utilization 0.2)")  # fmt: skip
    assert lines[1].startswith("    peer-a: 2 steps (2.000 s/step), generation trainer (transformers generate), ")
    assert "peer rows received 16, accepted 13 (from peer-b)" in lines[1]
    assert "peak 1.500 GiB allocated, 2.000 GiB reserved (cap 35.6 of 79.1 GiB)" in lines[1]
    bad = gpu_check.launcher_result(
        {"exit": 1}, {"peer-a": record(1, 0, errors=[{"error": "RuntimeError: out of memory"}]), "peer-b": {}}, 2
    )
    assert bad["status"] == "failed"
    assert bad["reason"] == ("trl-ftis swarm: exit 1; peer-a: RuntimeError: out of memory; peer-a: 1 of 2 steps; "
                             "peer-a: accepted no peer rows (16 received); peer-b: no record")  # fmt: skip
    stopped = gpu_check.launcher_result({"exit": None, "stopped": "time limit"}, {"peer-a": record(2, 1)}, 2)
    assert stopped["reason"] == "trl-ftis swarm: time limit"


def test_the_launcher_stage_is_skipped_with_the_reason_where_the_launcher_cannot_be_imported(tmp_path):
    """A machine without pydantic (the check does not carry it): the stage says so and starts nothing."""
    options = argparse.Namespace(mode="dry-run", budget=None, out=tmp_path / "out", work=tmp_path / "work",
                                 stand_ins=None, skip=None)  # fmt: skip
    check = gpu_check.Check(options)
    (tmp_path / "bare" / "pydantic").mkdir(parents=True)
    (tmp_path / "bare" / "pydantic" / "__init__.py").write_text("raise ImportError('no pydantic on this machine')\n")
    check.env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "bare"), str(ROOT / "src")])
    record = check.launcher(timeout=60)
    assert record == {
        "status": "skipped",
        "reason": "the swarm launcher cannot be imported: ImportError: no pydantic "
        "on this machine (it needs PyYAML, pydantic and psutil; the check carries psutil, not pydantic)",
    }
    assert not (tmp_path / "work" / "launcher").exists() and not list((tmp_path / "out" / "logs").iterdir())


# ---- the wheels -----------------------------------------------------------------------------------------------------
def test_a_wheel_is_taken_when_its_tags_fit_this_python():
    def wheel(name):
        return setup.parse_wheel(name)

    assert setup.compatible(wheel("trl-1.16.0-py3-none-any.whl"), (3, 12))
    assert setup.compatible(wheel("multiprocess-0.70.19-py312-none-any.whl"), (3, 12))
    assert not setup.compatible(wheel("multiprocess-0.70.19-py311-none-any.whl"), (3, 12))
    psutil = wheel("psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.manylinux_2_12_x86_64.whl")
    assert setup.compatible(psutil, (3, 13), machine="x86_64")
    assert not setup.compatible(psutil, (3, 13), machine="aarch64")
    xxhash = wheel("xxhash-4.1.0-cp311-cp311-manylinux2014_x86_64.whl")
    assert setup.compatible(xxhash, (3, 11), machine="x86_64") and not setup.compatible(xxhash, (3, 12), "x86_64")
    assert setup.parse_wheel("README.md") is None


def test_the_machine_gets_only_what_it_lacks_and_trl_at_this_version(tmp_path, monkeypatch):
    for name in ("trl-1.16.0-py3-none-any.whl", "accelerate-1.16.0-py3-none-any.whl",
                 "datasets-5.2.0-py3-none-any.whl", "multiprocess-0.70.19-py310-none-any.whl",
                 f"multiprocess-0.70.19-py3{sys.version_info[1]}-none-any.whl"):  # fmt: skip
        (tmp_path / name).write_bytes(b"")
    # A newer TRL than ours, a newer accelerate, no datasets, an older multiprocess.
    machine = {"trl": "1.17.0", "accelerate": "1.20.1", "multiprocess": "0.70.9"}
    monkeypatch.setattr(setup, "installed_version", machine.get)
    got = setup.choose(tmp_path)
    ours = f"multiprocess-0.70.19-py3{sys.version_info[1]}-none-any.whl"
    assert sorted(got["install"]) == sorted(["trl-1.16.0-py3-none-any.whl", "datasets-5.2.0-py3-none-any.whl", ours])
    assert got["kept"] == {"accelerate": "1.20.1"}  # the machine's own version stays in use
    machine.update(trl="1.16.0", accelerate="1.9.0")
    got = setup.choose(tmp_path)
    assert "trl-1.16.0-py3-none-any.whl" not in got["install"] and got["kept"]["trl"] == "1.16.0"
    assert "accelerate-1.16.0-py3-none-any.whl" in got["install"]  # older than ours: replaced
    assert setup.version_key("1.16.0rc1") == (1, 16, 0) and setup.version_key("0.70.19") > (0, 70, 9)
    assert setup.choose(tmp_path / "absent") == {"install": [], "kept": {}, "unusable": []}


def fake_wheel(folder: Path, name: str = "gpucheckprobe", version: str = "1.0") -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}/__init__.py", "VALUE = 42\n")
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{info}/RECORD", "")
    return path


def test_the_wheels_go_into_one_target_folder_with_one_pip_call(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    fake_wheel(wheels)
    record = setup.install(wheels, tmp_path / "site")
    assert record["status"] == "ok", record
    assert record["install"] == ["gpucheckprobe-1.0-py3-none-any.whl"] and record["method"].startswith("pip install")
    assert (tmp_path / "site" / "gpucheckprobe" / "__init__.py").read_text() == "VALUE = 42\n"
    assert setup.install(tmp_path / "none", tmp_path / "site2")["status"] == "skipped"


def test_a_wheel_rebuilt_from_installed_files_installs(tmp_path):
    """The preparation's fallback where `pip download` cannot reach an index: a wheel from a distribution's files."""
    path = setup.wheel_from_installed("dill", tmp_path)
    assert path.name.startswith("dill-") and path.name.endswith("-py3-none-any.whl")
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target",
               str(tmp_path / "site"), str(path)]  # fmt: skip
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "dill" / "__init__.py").exists()


def test_stand_ins_are_written_only_for_the_modules_asked(tmp_path):
    written = setup.write_stand_ins(tmp_path / "s", {"pyarrow": "missing"})
    assert written == ["pyarrow/__init__.py", "pyarrow/compute.py", "pyarrow/types.py"]
    code = (
        "import pyarrow, pyarrow.compute as pc; print(pyarrow.Array.__name__, 'stand-in' in pyarrow.__doc__.lower())"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "s")}
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split() == ["_StandIn", "True"], done.stderr


# ---- the dry run, end to end (default suite) -----------------------------------------------------------------------
def check_results(out: Path, mode: str, dtypes: tuple[str, ...] = ("fp32", "bf16")) -> tuple[dict, str]:
    """What every run of the check must have written, whatever the device, for the precisions `dtypes` (each one's
    stage alone and as a swarm; the ZeRO-3 stage always)."""
    results = json.loads((out / "gpu_check.json").read_text())
    report = (out / "gpu_check.txt").read_text()
    expected = [s for s in gpu_check.STAGES if s in ("launcher", "zero3") or s.split("-")[0] in dtypes]
    assert results["mode"] == mode and results["order"] == expected
    stages = results["stages"]
    assert set(stages) == set(expected)
    for name in expected[:-1]:
        assert stages[name]["status"] == "ok", (name, stages[name].get("reason"), stages[name].get("processes"))
    # No CUDA here: the ZeRO-3 step is skipped, and says why.
    assert stages["zero3"]["status"] == "skipped" and "no CUDA GPU" in stages["zero3"]["reason"]
    plan = results["plan"]
    assert set(results["figures"]) == set(dtypes)
    for dtype in dtypes:
        fig = results["figures"][dtype]
        raw = stages[dtype]["processes"]["alone"]["record"]
        # Generation: every row count timed, the ratios recomputed from the raw seconds.
        gen = fig["generation"]
        assert sorted(gen["seconds"], key=int) == [str(r) for r in plan["generation"]["rows"]]
        smallest = str(plan["generation"]["rows"][0])
        for rows, values in raw["generation"]["seconds"].items():
            assert len(values) == plan["generation"]["repeats"] and all(v > 0 for v in values)
            expected = (sum(values) / len(values)) / (sum(raw["generation"]["seconds"][smallest]) / len(values))
            assert gen["ratio_to_smallest"][rows] == pytest.approx(expected)
        # The step split: alone and both peers, parts adding up to the step, generation's share strictly inside.
        assert raw["trainer"]["global_step"] == plan["trainer"]["steps"]
        for split in (fig["alone"], *fig["swarm"].values()):
            assert split["steps"] == plan["trainer"]["steps"] - 1  # the warm-up step left out
            assert sum(split["shares"].values()) == pytest.approx(1.0, abs=1e-6)
            assert 0 < split["f"] < 1 and split["shares"]["training"] > 0
        assert fig["alone"]["shares"]["exchange"] == 0 and fig["alone"]["peer_rows_per_step"] == 0
        for name, split in fig["swarm"].items():  # the peers traded rows over the dir:// exchange
            assert split["peer_rows_per_step"] > 0 and split["shares"]["exchange"] > 0, name
        versus = fig["swarm_against_alone"]
        expected = sum(s["seconds_per_step"] for s in fig["swarm"].values()) / 2 / fig["alone"]["seconds_per_step"]
        assert versus["step_over_alone"] == pytest.approx(expected)
        assert fig["nonfinite"] == {"alone": None, "peer-a": None, "peer-b": None}
        # The probe ran every case, all finite on the CPU.
        assert len(fig["probe"]) == len(plan["probe"]["backends"]) * len(plan["probe"]["padded"])
        assert {case["status"] for case in fig["probe"]} == {"finite"}
        assert f"== {dtype}" in report
    assert "generation share f: alone" in report and "swarm peer step / alone step" in report
    check_launcher_stage(out, results, report)
    return results, report


def check_launcher_stage(out: Path, results: dict, report: str) -> None:
    """The `launcher` stage on the CPU: `trl-ftis swarm` ran both peers to the end, pinned to one GPU id with their
    shares (harmless on the CPU), each with the trainer's own generation, and each accepted the other's rows."""
    stage, plan = results["stages"]["launcher"], results["plan"]["launcher"]
    assert stage["launcher"]["exit"] == 0 and stage["vllm"] == "no CUDA GPU in this mode"
    config = stage["config"]
    assert config["args"]["use_vllm"] is False and config["args"]["use_cpu"] is True
    assert [(p["gpus"], p["gpu_share"]) for p in config["peers"]] == [(stage["gpus"], plan["gpu_share"])] * 2
    summary = json.loads((out / "stages" / "launcher-summary.json").read_text())  # the launcher's own summary.json
    assert summary["exit_code"] == 0 and [row["id"] for row in summary["peers"]] == list(gpu_check.PEERS)
    for name, peer in stage["peers"].items():
        other = next(p for p in gpu_check.PEERS if p != name)
        assert peer["steps"] == plan["steps"] and peer["generation"] == "trainer (transformers generate)"
        assert peer["cuda_visible_devices"] == stage["gpus"] and peer["gpu_memory_fraction"] == plan["gpu_share"]
        assert peer["memory"] == {"device": "cpu", "gpu_memory_fraction": plan["gpu_share"]}
        assert 0 < peer["rows_accepted"] <= peer["rows_received"] and peer["from"] == [other]
        row = next(r for r in summary["peers"] if r["id"] == name)
        assert (row["steps"], row["rows_accepted"]) == (plan["steps"], peer["rows_accepted"])
        steps = stage["processes"][name]["record"]["trainer"]["steps"]
        assert len(steps) == plan["steps"] and all(s["peer_rows"] > 0 for s in steps)  # merged in every step
        assert (out / "logs" / f"launcher-{name}.log").exists()
        assert (f"    {name}: {plan['steps']} steps (" in report
                and f"accepted {peer['rows_accepted']} (from {other}); memory on the cpu" in report)  # fmt: skip
    assert "launcher: ok (" in report and "trl-ftis swarm: 2 peers on GPU" in report
    assert "the trainer's own generation (no CUDA GPU in this mode)" in report


def test_the_dry_run_runs_the_fp32_stages_with_the_stand_ins_of_a_bare_machine(tmp_path):
    # The bf16 stages are the same code at another precision: the slow test below runs every stage.
    out = tmp_path / "out"
    done = run_check("--dry-run", "--out", out, "--work", tmp_path / "work", "--skip", "bf16", "bf16-swarm",
                     "--stand-ins", "pandas", "pyarrow", "datasets", timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results, report = check_results(out, "dry-run", dtypes=("fp32",))
    assert report in done.stdout  # printed as well
    # TRL imported and trained through the stand-ins, as on a machine without pandas and pyarrow.
    assert set(results["setup"]["stand_ins"]["modules"]) == {"pandas", "pyarrow", "datasets"}
    assert results["figures"]["fp32"]["environment"]["stand_ins"] == ["pandas", "pyarrow", "datasets"]
    assert (out / "logs" / "fp32-swarm-peer-a.log").exists() and (out / "stages" / "fp32-alone.json").exists()


@pytest.mark.slow  # the default suite runs the fp32 stages
def test_the_dry_run_runs_every_stage_with_the_stand_ins_of_a_bare_machine(tmp_path):
    out = tmp_path / "out"
    done = run_check("--dry-run", "--out", out, "--work", tmp_path / "work", "--stand-ins", "pandas", "pyarrow",
                     "datasets", timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results, report = check_results(out, "dry-run")
    assert report in done.stdout  # printed as well
    for dtype in ("fp32", "bf16"):
        assert results["figures"][dtype]["environment"]["stand_ins"] == ["pandas", "pyarrow", "datasets"]
    assert (out / "logs" / "fp32-swarm-peer-a.log").exists() and (out / "stages" / "bf16-alone.json").exists()


def test_the_output_goes_to_OUT_when_it_is_set(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "OUT": str(tmp_path / "out")}
    command = ["bash", str(SCRIPT), "--dry-run", "--work", str(tmp_path / "work"), "--skip", *gpu_check.STAGES]
    done = subprocess.run(command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert results["order"] == [] and results["setup"]["status"] == "ok"


# ---- SmolLM2-135M's shape on the CPU -------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_cpu_mode_runs_the_real_shape(tmp_path):
    out = tmp_path / "out"
    done = run_check("--cpu", "--out", out, "--work", tmp_path / "work", timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results, _ = check_results(out, "cpu")
    record = results["stages"]["fp32"]["processes"]["alone"]["record"]
    assert record["parameters"] == 134_515_008  # SmolLM2-135M's parameter count, tied embeddings counted once
