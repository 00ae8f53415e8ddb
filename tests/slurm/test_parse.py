"""Parsers and translation, on outputs captured from a real Slurm 22.05.8 (tests/slurm/data)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.slurm.parse import (
    SlurmParseError,
    expand_hostlist,
    mem_to_bytes,
    parse_gres,
    parse_key_values,
    parse_scontrol_job,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_squeue_format,
    parse_squeue_json,
)
from adapters.slurm.translate import (
    job_to_spec,
    node_to_pb,
    per_node_request,
    queue_of,
    sanitize_name,
    task_ids,
    task_index,
)
from muster.quantity import parse_resources

DATA = Path(__file__).parent / "data"


def read(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("n[1-3,7]", ["n1", "n2", "n3", "n7"]),
        ("n5", ["n5"]),
        ("n[1-2],gpu[08-10]", ["n1", "n2", "gpu08", "gpu09", "gpu10"]),
        ("a[1-2]b,c", ["a1b", "a2b", "c"]),
        ("n1,n3,n9", ["n1", "n3", "n9"]),
        ("", []),
        ("(null)", []),
    ],
)
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


def test_expand_hostlist_rejects_garbage() -> None:
    with pytest.raises(SlurmParseError):
        expand_hostlist("n[a-b]")


def test_sizes_and_gres() -> None:
    assert mem_to_bytes("2G") == 2 * 1024**3
    assert mem_to_bytes("512M") == 512 * 1024**2
    assert mem_to_bytes("1024") == 1024**3  # a bare number is MiB
    assert parse_gres("gpu:fake:4") == {"gpu": 4}
    assert parse_gres("gres:gpu:1") == {"gpu": 1}
    assert parse_gres("gpu:fake:2(IDX:0-1),shard:8") == {"gpu": 2, "shard": 8}
    assert parse_gres("gres:gpu") == {"gpu": 1}
    assert parse_gres("N/A") == {}
    with pytest.raises(SlurmParseError):
        mem_to_bytes("lots")


def test_sinfo_json_nodes_and_states() -> None:
    nodes = {n.name: n for n in parse_sinfo_json(read("sinfo_states.json"))}
    assert len(nodes) == 16  # one entry per node, although each is in two partitions
    n1 = nodes["n1"]
    assert (n1.cpus, n1.real_memory_mb, n1.gres, n1.features) == (32, 256000, {"gpu": 4}, ["gpu"])
    assert n1.partitions == ["batch", "staging"] and n1.schedulable
    assert nodes["n5"].gres == {} and nodes["n5"].features == ["cpu"]
    assert nodes["n14"].state == "down" and not nodes["n14"].schedulable  # admin DOWN
    assert nodes["n16"].flags == ["DRAIN"] and not nodes["n16"].schedulable  # idle+drain
    assert not nodes["n14"].not_responding


def test_scontrol_nodes_agree_with_sinfo() -> None:
    by_scontrol = {n.name: n for n in parse_scontrol_nodes(read("scontrol_nodes.txt"))}
    by_sinfo = {n.name: n for n in parse_sinfo_json(read("sinfo.json"))}
    assert by_scontrol.keys() == by_sinfo.keys()
    for name, node in by_scontrol.items():
        other = by_sinfo[name]
        assert (node.cpus, node.real_memory_mb, node.gres, node.features) == (
            other.cpus, other.real_memory_mb, other.gres, other.features)


def test_key_values_keep_spaces_and_nested_equals() -> None:
    kv = parse_key_values("JobId=3 Comment=a b  TRES=cpu=8,mem=8G Reason=Not responding OS=Linux 6.1 #1")
    assert kv == {"JobId": "3", "Comment": "a b", "TRES": "cpu=8,mem=8G", "Reason": "Not responding",
                  "OS": "Linux 6.1 #1"}


def test_squeue_format_jobs() -> None:
    jobs = {j.job_id: j for j in parse_squeue_format(read("squeue_fmt.txt"))}
    gang = jobs[13]  # -N4 --ntasks-per-node=1 -c2 --mem=2G --gres=gpu:1 -A teama --nice=-20
    assert (gang.state, gang.partition, gang.num_nodes, gang.cpus) == ("PENDING", "staging", 4, 8)
    assert gang.memory_bytes == 8 * 1024**3 and gang.per_node_gres() == {"gpu": 1}
    assert (gang.account, gang.nice, gang.reason) == ("teama", -20, "PartitionDown")
    spread = jobs[14]  # -N2 --ntasks-per-node=2 -c3 --mem-per-cpu=512M --gpus=3 --comment='q|x y'
    assert spread.per_node_gres() == {"gpu": 2}  # 3 GPUs over 2 nodes: 2 per node at most
    assert spread.comment == "q|x y"  # the separator inside the last field survives
    per_task = jobs[15]  # --gpus-per-task=1 --ntasks=2 on one node
    assert per_task.per_node_gres() == {"gpu": 2}
    running = jobs[16]  # root, -p batch -N2: Slurm placed it itself
    assert running.state == "RUNNING" and running.nodes == ["n1", "n2"] and running.active


def test_squeue_format_rejects_short_lines() -> None:
    with pytest.raises(SlurmParseError):
        parse_squeue_format("12|RUNNING|batch\n")


def test_squeue_json_jobs() -> None:
    jobs = {j.job_id: j for j in parse_squeue_json(read("squeue3.json"))}
    assert jobs[1].nodes == ["n1", "n2", "n3", "n4"] and jobs[1].required_nodes == ["n1", "n2", "n3", "n4"]
    assert jobs[2].user == "nobody" and jobs[2].partition == "staging"
    assert jobs[3].comment == "hello"


def test_scontrol_job_records() -> None:
    pending = parse_scontrol_job(read("job_pending.txt"))
    assert (pending.state, pending.reason, pending.partition, pending.nodes) == (
        "PENDING", "PartitionDown", "staging", [])
    running = parse_scontrol_job(read("job_running.txt"))
    assert (running.state, running.partition, running.required_nodes, running.nodes) == (
        "RUNNING", "batch", ["n7"], ["n7"])
    requeued = parse_scontrol_job(read("job_requeued.txt"))
    assert requeued.reason == "job_requeued_in_held_state" and requeued.restarts == 1
    failed = parse_scontrol_job(read("job_failed.txt"))
    assert (failed.state, failed.exit_code) == ("FAILED", 3)
    with pytest.raises(SlurmParseError):
        parse_scontrol_job("slurm_load_jobs error: Invalid job id specified")


def test_node_translation() -> None:
    nodes = {n.name: n for n in parse_sinfo_json(read("sinfo_states.json"))}
    gpu = node_to_pb(nodes["n1"])
    assert parse_resources(dict(gpu.allocatable.quantities)) == {
        "cpu": 32000.0, "memory": 256000 * 1024**2, "nvidia.com/gpu": 4000.0}
    assert gpu.labels["feature.slurm.schedmd.com/gpu"] == "true"
    assert not gpu.unschedulable and not gpu.not_ready
    assert node_to_pb(nodes["n16"]).unschedulable  # drained
    assert node_to_pb(nodes["n14"]).unschedulable  # down


def test_job_translation_is_a_gang_with_per_node_request() -> None:
    jobs = {j.job_id: j for j in parse_squeue_format(read("squeue_fmt.txt"))}
    spec = job_to_spec(jobs[13], muster_id="slurm-13", queue=queue_of(jobs[13], "account"))
    assert spec.min_member == 4 and spec.queue == "teama" and spec.priority == 20
    (group,) = spec.task_groups
    assert group.replicas == 4
    assert dict(group.request.quantities) == {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": "1"}
    assert spec.annotations["slurm.schedmd.com/job-id"] == "13"
    assert per_node_request(jobs[14]) == {"cpu": "6", "memory": "3Gi", "nvidia.com/gpu": "2"}
    # The spec is deterministic: resubmitting after an adapter restart is a server-side no-op.
    assert job_to_spec(jobs[13], muster_id="slurm-13", queue="teama") == spec


def test_queue_names_are_sanitised() -> None:
    jobs = {j.job_id: j for j in parse_squeue_format(read("squeue_fmt.txt"))}
    assert queue_of(jobs[14], "comment") == "q-x-y"
    assert queue_of(jobs[15], "account") == "default"  # no account
    assert sanitize_name("  ") == "default" and sanitize_name("root") == "root"


def test_task_ids_round_trip() -> None:
    ids = task_ids("slurm-7", 3)
    assert ids == ["slurm-7/node-0", "slurm-7/node-1", "slurm-7/node-2"]
    assert [task_index(t) for t in ids] == [0, 1, 2]
    assert task_index("slurm-7/worker-1") is None
