"""Where a swarm's peers, controls and vLLM servers run (`launcher/placement.py`): placement mistakes refused before
anything starts, one line each naming the peers and GPUs, and the packages a config needs (vllm, deepspeed) reported
by `check_files` (a dry run's warning, a real start's refusal)."""

import importlib.machinery
import importlib.util
import io
from pathlib import Path

import pytest
import yaml

from trl_ftis import cli
from trl_ftis.launcher import SwarmConfigError, backend_kind, check_files, load_swarm_config, run_swarm
from trl_ftis.launcher.placement import placement_problems, process_count

PEER = str(Path(__file__).resolve().parents[1] / "fixtures" / "swarm_peer.py")
REAL_FIND_SPEC = importlib.util.find_spec


def _local(peers, **top):
    return {"script": "p.py", "peers": peers, **top}


def _slurm(peers, **top):
    return {"launcher": "slurm", "script": "p.py", "peers": peers, **top}


def _refused(raw) -> list[str]:
    """The problems of a config that must be refused (each one line)."""
    with pytest.raises(SwarmConfigError) as info:
        load_swarm_config(raw)
    for problem in info.value.errors:
        assert problem in str(info.value) and "\n" not in problem
    return info.value.errors


def _only(raw) -> str:
    (problem,) = _refused(raw)
    return problem


def _accelerate_config(tmp_path: Path, name: str, **settings) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"compute_environment": "LOCAL_MACHINE", **settings}))
    return str(path)


def _server(gpus, **block):
    return {"gpus": gpus, **block}


# --------------------------------------------------------------------------------------------------------------------
# a. GPUs shared by peers (controls included)
# --------------------------------------------------------------------------------------------------------------------


def test_peers_on_one_gpu_without_gpu_share_are_refused():
    problem = _only(_local([{"id": "a", "gpus": "0,1"}, {"id": "b", "gpus": [1, 2]}, {"id": "c", "gpus": "3"}]))
    assert problem.startswith("peers 'a', 'b': both use GPU 1 (`gpus`), and 'a', 'b' have no `gpu_share`")
    assert "'c'" not in problem


def test_a_peer_without_share_beside_one_with_a_share_is_named():
    problem = _only(_local([{"id": "a", "gpus": 0, "gpu_share": 0.4}, {"id": "b", "gpus": "0"}]))
    assert problem.startswith("peers 'a', 'b': both use GPU 0 (`gpus`), and 'b' has no `gpu_share`")


def test_shares_on_one_gpu_of_multi_gpu_peers_add_up_to_at_most_one():
    raw = _local(
        [
            {"id": "a", "gpus": "0,1", "gpu_share": 0.6},
            {"id": "b", "gpus": "1,2", "gpu_share": 0.5},
            {"id": "c", "gpus": "2", "gpu_share": 0.5},
        ]
    )
    assert _only(raw) == "peers 'a', 'b': `gpu_share` values on GPU 1 add up to 1.1 > 1 (one GPU's memory)"


def test_args_gpu_memory_fraction_counts_as_a_share():
    raw = _local(
        [{"id": "a", "gpus": "0", "args": {"gpu_memory_fraction": 0.7}}, {"id": "b", "gpus": 0, "gpu_share": 0.4}]
    )
    assert "add up to 1.1 > 1" in _only(raw)


def test_a_gpu_listed_twice_is_refused():
    problem = _only(_local([{"id": "a", "model": "m", "gpus": "0", "vllm_server": _server("1,1")}]))
    assert problem == "peer 'a': `vllm_server.gpus` '1,1' lists GPU 1 more than once"


def test_controls_run_beside_their_peer_on_its_gpus():
    problem = _only(_local([{"id": "a", "gpus": "0"}, {"id": "b", "gpus": "1", "controls": []}], controls=["alone"]))
    assert problem.startswith("peers 'a', 'a-alone': both use GPU 0 (`gpus`), and 'a', 'a-alone' have no `gpu_share`")
    assert "'a-alone' is a control: a control runs at the same time as its peer" in problem
    shared = _only(_local([{"id": "a", "gpus": "0", "gpu_share": 0.45}], controls=["alone", "alone-rows"]))
    assert shared.startswith("peers 'a', 'a-alone', 'a-alone-rows': `gpu_share` values on GPU 0 add up to 1.35 > 1")
    # Shares that fit: the peer and its control each take a third.
    config = load_swarm_config(_local([{"id": "a", "gpus": "0", "gpu_share": 0.33}], controls=["alone"]))
    assert [peer.id for peer in config.peers] == ["a", "a-alone"]


# --------------------------------------------------------------------------------------------------------------------
# b. A vLLM server's GPUs are its own
# --------------------------------------------------------------------------------------------------------------------


def test_a_server_on_its_own_peers_gpus_is_refused():
    problem = _only(_local([{"id": "a", "model": "m", "gpus": "0,1", "vllm_server": _server("1")}]))
    assert problem == (
        "peer 'a': its vLLM server (`vllm_server.gpus` '1') and its training (`gpus` '0,1') both use GPU 1: the "
        "server needs GPUs of its own"
    )


def test_a_server_on_another_peers_gpus_or_another_server_is_refused():
    raw = _local(
        [
            {"id": "a", "model": "m", "gpus": "0", "vllm_server": _server("1,2")},
            {"id": "b", "gpus": "2"},
            {"id": "c", "model": "m", "gpus": "3", "vllm_server": _server([1, 4])},
        ]
    )
    found = _refused(raw)
    assert found == [
        "peers 'a', 'b': the vLLM server of 'a' (`vllm_server.gpus` '1,2') and the training of 'b' (`gpus` '2') both "
        "use GPU 2: a server needs GPUs of its own",
        "peers 'a', 'c': their vLLM servers (`vllm_server.gpus` '1,2' and '1,4') both use GPU 1: each server needs "
        "GPUs of its own",
    ]


# --------------------------------------------------------------------------------------------------------------------
# c. One accelerate process per GPU
# --------------------------------------------------------------------------------------------------------------------


def test_num_processes_not_the_number_of_gpus_is_refused():
    raw = _local([{"id": "a", "num_processes": 2, "gpus": "0,1,2"}], launcher="accelerate")
    assert _only(raw).startswith("peer 'a': `num_processes` 2, but `gpus` '0,1,2' is 3 GPUs: accelerate starts one")


def test_the_accelerate_configs_num_processes_counts_when_the_peer_gives_none(tmp_path):
    ddp = _accelerate_config(tmp_path, "ddp.yaml", distributed_type="MULTI_GPU", num_processes=2)
    raw = _local([{"id": "a", "accelerate_config": ddp, "gpus": "4"}], launcher="accelerate")
    assert _only(raw).startswith(
        "peer 'a': `num_processes: 2` in its accelerate_config ddp.yaml, but `gpus` '4' is 1 GPU"
    )
    # The peer's own num_processes overrides the file's, and agrees.
    ok = load_swarm_config(
        _local([{"id": "a", "accelerate_config": ddp, "num_processes": 1, "gpus": "4"}], launcher="accelerate")
    )
    assert process_count(ok.peers[0]) == 1


def test_an_unreadable_accelerate_config_or_a_python_peer_is_not_checked(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("num_processes: [unclosed\n")
    raw = _local(
        [
            {"id": "a", "launcher": "accelerate", "accelerate_config": str(broken), "gpus": "0,1"},
            {"id": "b", "launcher": "accelerate", "accelerate_config": str(tmp_path / "missing.yaml"), "gpus": "2,3"},
            {"id": "c", "gpus": "4,5"},  # one python process over two GPUs (device_map): fine
        ]
    )
    config = load_swarm_config(raw)
    assert [process_count(peer) for peer in config.peers] == [None, None, 1]


# --------------------------------------------------------------------------------------------------------------------
# d. vLLM's parallel sizes; e. colocated vLLM inside a peer's share
# --------------------------------------------------------------------------------------------------------------------


def test_a_server_larger_than_its_gpus_is_refused():
    block = _server("3", args={"tensor_parallel_size": 2, "data_parallel_size": 2})
    problem = _only(_local([{"id": "a", "model": "m", "gpus": "0", "vllm_server": block}]))
    assert problem == (
        "peer 'a': its vLLM server needs 4 GPUs (tensor_parallel_size x data_parallel_size of `vllm_server.args`), "
        "but `vllm_server.gpus` '3' is 1 GPU"
    )
    wide = _server("1,2,3,4", args=block["args"])
    assert (
        load_swarm_config(_local([{"id": "a", "model": "m", "gpus": "0", "vllm_server": wide}])).peers[0].vllm_server
    )


def test_colocated_tensor_parallel_size_must_divide_the_processes():
    colocated = {"use_vllm": True, "vllm_tensor_parallel_size": 2}
    raw = _local([{"id": "a", "num_processes": 3, "gpus": "0,1,2", "args": colocated}], launcher="accelerate")
    assert _only(raw).startswith(
        "peer 'a': colocated vLLM's `args.vllm_tensor_parallel_size` 2 does not divide the peer's 3 processes "
        "(`num_processes` 3)"
    )
    one = _only(_local([{"id": "a", "args": {**colocated, "vllm_mode": "colocate"}}]))
    assert "does not divide the peer's 1 process (a python peer is one process)" in one
    # Server mode (the user's own server) or two processes: nothing to say.
    load_swarm_config(_local([{"id": "a", "args": {**colocated, "vllm_mode": "server"}}]))
    load_swarm_config(
        _local([{"id": "a", "num_processes": 2, "gpus": "0,1", "args": colocated}], launcher="accelerate")
    )


def test_colocated_vllm_memory_must_be_below_the_peers_share():
    default = _only(_local([{"id": "a", "gpus": "0", "gpu_share": 0.3, "args": {"use_vllm": "true"}}]))
    assert default.startswith(
        "peer 'a': colocated vLLM's `args.vllm_gpu_memory_utilization` 0.3 (TRL default) is not below its `gpu_share` "
        "0.3 on GPU 0"
    )
    given = _only(
        _local([{"id": "a", "gpu_share": 0.5, "args": {"use_vllm": True, "vllm_gpu_memory_utilization": 0.6}}])
    )
    assert given.startswith("peer 'a': colocated vLLM's `args.vllm_gpu_memory_utilization` 0.6 is not below its")
    load_swarm_config(_local([{"id": "a", "gpu_share": 0.3, "args": {"use_vllm": False}}]))  # no vLLM at all


def test_every_mistake_is_listed_at_once():
    raw = _local(
        [
            {"id": "a", "num_processes": 2, "gpus": "0", "args": {"use_vllm": True}, "gpu_share": 0.2},
            {"id": "b", "gpus": "0"},
        ],
        launcher="accelerate",
    )
    with pytest.raises(SwarmConfigError) as info:
        load_swarm_config(raw)
    assert len(info.value.errors) == 3
    starts = ("peers 'a', 'b': both use GPU 0", "peer 'a': `num_processes` 2", "peer 'a': colocated vLLM's")
    for text in starts:
        assert sum(problem.startswith(text) for problem in info.value.errors) == 1
        assert f"  - {text}" in str(info.value)
    assert "is not below its `gpu_share` 0.2" in str(info.value)


# --------------------------------------------------------------------------------------------------------------------
# SLURM: a server's GPUs are positions among the job's
# --------------------------------------------------------------------------------------------------------------------


def test_slurm_server_positions_must_be_among_the_jobs_gpus():
    problem = _only(_slurm([{"id": "a", "model": "m", "slurm": {"gpus": 2}, "vllm_server": _server("1,2")}]))
    assert problem == (
        "peer 'a': `vllm_server.gpus` '1,2' names GPU 2, but on SLURM they are positions among the job's 2 GPUs per "
        "node (`slurm.gpus` 2): 0 to 1"
    )


def test_slurm_server_leaves_the_training_a_gpu():
    problem = _only(_slurm([{"id": "a", "model": "m", "vllm_server": _server("0,1")}], slurm={"gpus": 2}))
    assert problem.startswith("peer 'a': `vllm_server.gpus` '0,1' takes all 2 of the job's GPUs (`slurm.gpus` 2)")


@pytest.mark.parametrize("gpus", [None, 0])
def test_slurm_server_in_a_job_without_gpus_is_refused(gpus):
    slurm = {} if gpus is None else {"slurm": {"gpus": gpus}}
    problem = _only(_slurm([{"id": "a", "model": "m", "vllm_server": _server("0"), **slurm}]))
    assert problem.startswith("peer 'a': has a `vllm_server` (`vllm_server.gpus` '0') but its job asks for no GPUs")


def test_slurm_server_beside_training_gpus_is_accepted():
    config = load_swarm_config(_slurm([{"id": "a", "model": "m", "vllm_server": _server("3")}], slurm={"gpus": 4}))
    assert config.peers[0].vllm_server.gpus == "3"
    assert placement_problems(config.peers, backend_kind("slurm")) == []


# --------------------------------------------------------------------------------------------------------------------
# Correct placements
# --------------------------------------------------------------------------------------------------------------------


def test_an_8_gpu_node_with_two_peers_and_their_servers_is_accepted(tmp_path):
    zero2 = _accelerate_config(tmp_path, "zero2.yaml", distributed_type="DEEPSPEED", num_processes=2)
    peers = [
        {"id": "small", "model": "s", "gpus": "0,1,2", "vllm_server": _server("3")},
        {"id": "large", "model": "l", "gpus": [4, 5, 6], "vllm_server": _server(7)},
    ]
    raw = _local(peers, launcher="accelerate")
    for peer in raw["peers"]:
        peer.update(accelerate_config=zero2, num_processes=3)
    config = load_swarm_config(raw)
    assert [(peer.gpus, peer.vllm_server.gpus) for peer in config.peers] == [("0,1,2", "3"), ("4,5,6", "7")]
    assert placement_problems(config.peers, backend_kind("local")) == []


def test_two_peers_sharing_one_gpu_with_colocated_vllm_below_their_shares_are_accepted():
    args = {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.1}
    raw = _local([{"id": "a", "gpus": "0", "gpu_share": 0.45}, {"id": "b", "gpus": 0, "gpu_share": 0.45}], args=args)
    config = load_swarm_config(raw)
    assert [peer.gpu_share for peer in config.peers] == [0.45, 0.45]


# --------------------------------------------------------------------------------------------------------------------
# The command line: refused before anything starts
# --------------------------------------------------------------------------------------------------------------------


def test_dry_run_refuses_a_placement_mistake_before_anything_starts(tmp_path, capsys):
    path = tmp_path / "swarm.yaml"
    peers = [{"id": "a", "model": "m", "gpus": "0", "vllm_server": {"gpus": "0"}}, {"id": "b", "gpus": "1"}]
    path.write_text(yaml.safe_dump({"script": PEER, "peers": peers}))
    run_dir = tmp_path / "run"
    assert cli.main(["swarm", str(path), "--dry-run", "--run-dir", str(run_dir)]) == 2
    captured = capsys.readouterr()
    assert f"invalid swarm config {path}:" in captured.err
    assert "  - peer 'a': its vLLM server (`vllm_server.gpus` '0') and its training (`gpus` '0') both use GPU 0" in (
        captured.err
    )
    assert "--peer_id" not in captured.out  # no command was shown
    assert not run_dir.exists()
    assert cli.main(["swarm", str(path), "--run-dir", str(run_dir)]) == 2  # nor started
    assert not run_dir.exists()


# --------------------------------------------------------------------------------------------------------------------
# Packages: vllm and deepspeed
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def without(monkeypatch):
    """`importlib.util.find_spec` answering None for the packages named and a spec for vllm and deepspeed otherwise
    (neither needs to be installed here)."""

    def hide(*packages):
        def find_spec(name, *args, **kwargs):
            if name in packages:
                return None
            if name in ("vllm", "deepspeed"):
                return importlib.machinery.ModuleSpec(name, None)
            return REAL_FIND_SPEC(name, *args, **kwargs)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)

    return hide


def _package_problems(config) -> list[str]:
    return [problem for problem in check_files(config) if "pip install" in problem]


def test_colocated_vllm_and_deepspeed_need_their_packages(tmp_path, without):
    zero3 = _accelerate_config(tmp_path, "zero3.yaml", distributed_type="DEEPSPEED", num_processes=1)
    ds_key = _accelerate_config(tmp_path, "ds.yaml", deepspeed_config={"zero_stage": 2})
    raw = _local(
        [
            {"id": "a", "launcher": "accelerate", "accelerate_config": zero3, "args": {"use_vllm": True}},
            {"id": "b", "launcher": "accelerate", "accelerate_config": ds_key},
            {"id": "c", "args": {"use_vllm": True, "vllm_mode": "server"}},  # the user's own server
        ],
        controls=["alone"],
    )
    config = load_swarm_config(raw)
    without("vllm", "deepspeed")
    assert _package_problems(config) == [
        "peer 'a': colocated vLLM (`args.use_vllm: true`) needs the vllm package, which is not installed: "
        "pip install vllm",
        "peer 'a': its accelerate_config zero3.yaml (`distributed_type: DEEPSPEED`) needs the deepspeed package, "
        "which is not installed: pip install deepspeed",
        "peer 'b': its accelerate_config ds.yaml (`deepspeed_config`) needs the deepspeed package, which is not "
        "installed: pip install deepspeed",
    ]  # said once per peer, not again for its controls
    without()  # both installed
    assert _package_problems(config) == []


def test_a_server_needs_vllm_unless_it_runs_a_command_of_its_own(without):
    raw = _local(
        [
            {"id": "a", "model": "m", "gpus": "0", "vllm_server": _server("1")},
            {"id": "b", "model": "m", "gpus": "2", "vllm_server": _server("3", command=["python", "stand_in.py"])},
        ]
    )
    config = load_swarm_config(raw)
    without("vllm")
    assert _package_problems(config) == [
        "peer 'a': its `vllm_server` (`trl vllm-serve`) needs the vllm package, which is not installed: "
        "pip install vllm"
    ]


def test_a_missing_package_is_a_dry_run_warning_and_refuses_a_real_start(tmp_path, without, capsys):
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump({"script": PEER, "peers": [{"id": "a", "args": {"use_vllm": True}}]}))
    without("vllm")
    run_dir = tmp_path / "run"
    assert cli.main(["swarm", str(path), "--dry-run", "--run-dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "# warning: peer 'a': colocated vLLM (`args.use_vllm: true`) needs the vllm package" in out
    assert "--peer_id a" in out and not run_dir.exists()
    config = load_swarm_config(path, run_dir)
    with pytest.raises(SwarmConfigError, match=r"peer 'a': colocated vLLM .* pip install vllm"):
        run_swarm(config, stream=io.StringIO())
    assert not (run_dir / "logs").exists()


def test_a_local_server_peer_without_gpus_is_refused():
    """Without `gpus` a peer sees every GPU of the machine, its server's too."""
    problem = _only(_local([{"id": "a", "model": "m", "vllm_server": _server("3")}]))
    assert problem == (
        "peer 'a': its vLLM server runs on GPU 3 (`vllm_server.gpus` '3'), but the peer has no `gpus`: it would see "
        "every GPU, the server's too; set its `gpus` to the GPUs it trains on"
    )


def test_a_slurm_server_peer_on_several_nodes_is_refused():
    raw = _slurm(
        [{"id": "a", "model": "m", "launcher": "accelerate", "vllm_server": _server("3")}],
        slurm={"gpus": 4, "nodes": 2},
    )
    assert _only(raw).startswith("peer 'a': has a `vllm_server` and `slurm.nodes` 2: the server takes GPUs of the")


def test_on_slurm_a_missing_package_is_only_a_dry_run_warning(without, capsys):
    """The jobs import vllm and deepspeed on their nodes (`slurm.setup` may install them there): the machine that
    submits them need not have them."""
    from trl_ftis.launcher import dry_run

    config = load_swarm_config(
        _slurm([{"id": "a", "model": "m", "vllm_server": _server("1")}], slurm={"gpus": 2}), backend="slurm"
    )
    without("vllm")
    assert _package_problems(config) == []  # a real submission is not refused
    out = io.StringIO()
    dry_run(config, out)
    assert (
        "# warning: peer 'a': its `vllm_server` (`trl vllm-serve`) needs the vllm package, which is not installed: "
        "pip install vllm (here, where you submit; the jobs need it on their nodes)"
    ) in out.getvalue()
