"""Parsers and translation, on outputs captured from a real Slurm 22.05.8 (tests/slurm/data)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from adapters.slurm.parse import (
    SlurmJob,
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
    Untranslatable,
    feature_label,
    foreign_tasks,
    job_to_spec,
    node_to_pb,
    parse_constraint,
    per_node_request,
    queue_of,
    sanitize_name,
    task_ids,
    task_index,
    untranslatable,
)
from muster.quantity import parse_resources
from muster.v1 import muster_pb2 as pb

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
    assert n1.partitions == ["batch", "staging"]
    assert n1.schedulable
    assert nodes["n5"].gres == {}
    assert nodes["n5"].features == ["cpu"]
    assert nodes["n14"].state == "down"
    assert not nodes["n14"].schedulable
    assert nodes["n16"].flags == ["DRAIN"]
    assert not nodes["n16"].schedulable
    assert not nodes["n14"].not_responding


def test_scontrol_nodes_agree_with_sinfo() -> None:
    by_scontrol = {n.name: n for n in parse_scontrol_nodes(read("scontrol_nodes.txt"))}
    by_sinfo = {n.name: n for n in parse_sinfo_json(read("sinfo.json"))}
    assert by_scontrol.keys() == by_sinfo.keys()
    for name, node in by_scontrol.items():
        other = by_sinfo[name]
        assert (node.cpus, node.real_memory_mb, node.gres, node.features) == (
            other.cpus,
            other.real_memory_mb,
            other.gres,
            other.features,
        )


def test_key_values_keep_spaces_and_nested_equals() -> None:
    kv = parse_key_values(
        "JobId=3 Comment=a b  TRES=cpu=8,mem=8G Reason=Not responding OS=Linux 6.1 #1"
    )
    assert kv == {
        "JobId": "3",
        "Comment": "a b",
        "TRES": "cpu=8,mem=8G",
        "Reason": "Not responding",
        "OS": "Linux 6.1 #1",
    }


def test_squeue_format_jobs() -> None:
    jobs = {j.job_id: j for j in parse_squeue_format(read("squeue_fmt.txt"))}
    gang = jobs[28]  # -N4 --ntasks-per-node=1 -c2 --mem=2G --gres=gpu:1 -A teama --nice=-20
    assert (gang.state, gang.partition, gang.num_nodes, gang.cpus) == ("PENDING", "staging", 4, 8)
    assert gang.memory_bytes == 8 * 1024**3
    assert gang.per_node_gres() == {"gpu": 1}
    assert (gang.account, gang.nice, gang.reason) == ("teama", -20, "PartitionDown")
    spread = jobs[29]  # -N2 --ntasks-per-node=2 -c3 --mem-per-cpu=512M --gpus=3 --comment='q|x y'
    assert spread.per_node_gres() == {"gpu": 2}  # 3 GPUs over 2 nodes: 2 per node at most
    assert spread.comment == "q|x y"  # the separator inside the last field survives
    per_task = jobs[30]  # --gpus-per-task=1 --ntasks=2 on one node
    assert per_task.per_node_gres() == {"gpu": 2}
    running = jobs[27]  # root, -p batch -N2: Slurm placed it itself
    assert running.state == "RUNNING"
    assert running.nodes == ["n1", "n2"]
    assert running.active


def test_squeue_format_rejects_short_lines() -> None:
    with pytest.raises(SlurmParseError):
        parse_squeue_format("12|RUNNING|batch\n")


def test_squeue_json_jobs() -> None:
    jobs = {j.job_id: j for j in parse_squeue_json(read("squeue3.json"))}
    assert jobs[1].nodes == ["n1", "n2", "n3", "n4"]
    assert jobs[1].required_nodes == [
        "n1",
        "n2",
        "n3",
        "n4",
    ]
    assert jobs[2].user == "nobody"
    assert jobs[2].partition == "staging"
    assert jobs[3].comment == "hello"


def test_scontrol_job_records() -> None:
    pending = parse_scontrol_job(read("job_pending.txt"))
    assert (pending.state, pending.reason, pending.partition, pending.nodes) == (
        "PENDING",
        "PartitionDown",
        "staging",
        [],
    )
    running = parse_scontrol_job(read("job_running.txt"))
    assert (running.state, running.partition, running.required_nodes, running.nodes) == (
        "RUNNING",
        "batch",
        ["n7"],
        ["n7"],
    )
    requeued = parse_scontrol_job(read("job_requeued.txt"))
    assert requeued.reason == "job_requeued_in_held_state"
    assert requeued.restarts == 1
    failed = parse_scontrol_job(read("job_failed.txt"))
    assert (failed.state, failed.exit_code) == ("FAILED", 3)
    with pytest.raises(SlurmParseError):
        parse_scontrol_job("slurm_load_jobs error: Invalid job id specified")


def test_node_translation() -> None:
    nodes = {n.name: n for n in parse_sinfo_json(read("sinfo_states.json"))}
    gpu = node_to_pb(nodes["n1"])
    assert parse_resources(dict(gpu.allocatable.quantities)) == {
        "cpu": 32000.0,
        "memory": 256000 * 1024**2,
        "nvidia.com/gpu": 4000.0,
    }
    assert gpu.labels["feature.slurm.schedmd.com/gpu"] == "true"
    assert not gpu.unschedulable
    assert not gpu.not_ready
    assert node_to_pb(nodes["n16"]).unschedulable  # drained
    assert node_to_pb(nodes["n14"]).unschedulable  # down


def test_job_translation_is_a_gang_with_per_node_request() -> None:
    jobs = {j.job_id: j for j in parse_squeue_format(read("squeue_fmt.txt"))}
    spec = job_to_spec(jobs[28], muster_id="slurm-28", queue=queue_of(jobs[28], "account"))
    assert spec.min_member == 4
    assert spec.queue == "teama"
    assert spec.priority == 20
    (group,) = spec.task_groups
    assert group.replicas == 4
    assert dict(group.request.quantities) == {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": "1"}
    assert spec.annotations["slurm.schedmd.com/job-id"] == "28"
    assert per_node_request(jobs[29]) == {"cpu": "6", "memory": "3Gi", "nvidia.com/gpu": "2"}
    # The spec is deterministic: resubmitting after an adapter restart is a server-side no-op.
    assert job_to_spec(jobs[28], muster_id="slurm-28", queue="teama") == spec


def test_queue_names_are_sanitised() -> None:
    jobs = {j.job_id: j for j in parse_squeue_format(read("squeue_fmt.txt"))}
    assert queue_of(jobs[29], "comment") == "q-x-y"
    assert queue_of(jobs[30], "account") == "default"  # no account
    assert sanitize_name("  ") == "default"
    assert sanitize_name("root") == "root"


def test_task_ids_round_trip() -> None:
    ids = task_ids("slurm-7", 3)
    assert ids == ["slurm-7/node-0", "slurm-7/node-1", "slurm-7/node-2"]
    assert [task_index(t) for t in ids] == [0, 1, 2]
    assert task_index("slurm-7/worker-1") is None


# --- --constraint, --exclusive, --mem, --ntasks-per-node (recorded: squeue_fmt.txt and
# --- squeue_exclusive.json are the same jobs 27-41, read with -O SQUEUE_FORMAT and with --json)

FMT_JOBS = {j.job_id: j for j in parse_squeue_format(read("squeue_fmt.txt"))}
JSON_JOBS = {j.job_id: j for j in parse_squeue_json(read("squeue_exclusive.json"))}


def group_of(job_id: int) -> pb.TaskGroup:
    (group,) = job_to_spec(FMT_JOBS[job_id], muster_id=f"slurm-{job_id}", queue="q").task_groups
    return group


def required_terms(group: pb.TaskGroup) -> list[list[tuple[str, str]]]:
    return [
        [(r.key, r.operator) for r in t.match_expressions]
        for t in group.affinity.node_affinity.required
    ]


GPU, CPU = "feature.slurm.schedmd.com/gpu", "feature.slurm.schedmd.com/cpu"


def test_format_and_json_agree_on_the_new_fields() -> None:
    assert FMT_JOBS.keys() == JSON_JOBS.keys() == set(range(27, 42))
    for job_id, job in FMT_JOBS.items():
        other = JSON_JOBS[job_id]
        assert (
            job.features,
            job.oversubscribe,
            job.exclusive,
            job.cpus,
            job.memory_bytes,
            job.tasks_per_node,
            job.per_node_gres(),
        ) == (
            other.features,
            other.oversubscribe,
            other.exclusive,
            other.cpus,
            other.memory_bytes,
            other.tasks_per_node,
            other.per_node_gres(),
        ), job_id
    assert (
        FMT_JOBS[35].comment == JSON_JOBS[35].comment == "a#|b|c"
    )  # separators inside the comment


def test_oversubscribe_gives_the_exclusive_mode() -> None:
    # 31 --exclusive, 32 --exclusive=user, 33 --exclusive=mcs, 34 --oversubscribe, 28 default
    assert [FMT_JOBS[i].oversubscribe for i in (31, 32, 33, 34, 28)] == [
        "NO",
        "USER",
        "MCS",
        "YES",
        "OK",
    ]
    assert [FMT_JOBS[i].exclusive for i in (31, 32, 33, 34, 28)] == ["node", "user", "mcs", "", ""]
    assert FMT_JOBS[39].exclusive == "node"
    assert FMT_JOBS[39].features == "gpu"


def test_exclusive_is_an_anti_affinity_to_every_task_on_the_node() -> None:
    group = group_of(31)
    (term,) = group.affinity.pod_anti_affinity.required
    assert term.topology_key == "kubernetes.io/hostname"
    assert term.label_selector == pb.LabelSelector()  # empty: matches every task ...
    assert list(term.namespaces) == ["default", ""]  # ... of Slurm jobs and foreign ones
    assert group.labels["slurm.schedmd.com/user"] == "root"
    assert dict(group.request.quantities) == {"cpu": "1", "memory": "1Gi"}  # what it asked for
    assert not group.affinity.HasField("node_affinity") or not group.affinity.node_affinity.required
    assert (
        group_of(33).affinity.pod_anti_affinity == group.affinity.pod_anti_affinity
    )  # mcs: as strict
    for plain in (28, 34, 35):  # default and --oversubscribe: no anti-affinity
        assert not group_of(plain).affinity.pod_anti_affinity.required


def test_exclusive_user_excludes_only_other_users_tasks() -> None:
    (term,) = group_of(32).affinity.pod_anti_affinity.required
    (req,) = term.label_selector.match_expressions
    assert (req.key, req.operator, list(req.values)) == (
        "slurm.schedmd.com/user",
        "NotIn",
        ["root"],
    )
    assert list(term.namespaces) == ["default", ""]
    assert not term.label_selector.match_labels


def test_exclusive_gang_with_constraint_and_whole_node_memory() -> None:
    group = group_of(39)  # -N2 --exclusive --mem=0 --gres=gpu:2 --constraint=gpu
    assert group.replicas == 2
    assert dict(group.request.quantities) == {"cpu": "1", "memory": "250Gi", "nvidia.com/gpu": "2"}
    assert required_terms(group) == [[(GPU, "Exists")]]
    assert len(group.affinity.pod_anti_affinity.required) == 1


def test_constraint_and_or_become_node_affinity_terms() -> None:
    assert required_terms(group_of(35)) == [
        [(GPU, "Exists")],
        [(CPU, "Exists")],
    ]  # gpu|cpu: ORed terms
    assert required_terms(group_of(41)) == [[(GPU, "Exists")]]  # gpu&gpu
    # (gpu|cpu)&gpu -> (gpu&gpu) | (cpu&gpu)
    assert required_terms(group_of(38)) == [[(GPU, "Exists")], [(CPU, "Exists"), (GPU, "Exists")]]
    assert required_terms(group_of(36)) == [
        [(GPU, "Exists")],
        [(CPU, "Exists")],
    ]  # [gpu|cpu] on one node
    assert not required_terms(group_of(28))
    assert group_of(35).labels["slurm.schedmd.com/user"] == "root"


@pytest.mark.parametrize(
    ("text", "nodes", "terms"),
    [
        ("a&b", 1, [{("a", True), ("b", True)}]),
        ("a|b", 3, [{("a", True)}, {("b", True)}]),
        # Slurm 22.05 reads & and | left to right (sbatch --test-only: cpu|gpu&gpu needs gpu nodes).
        ("a|b&c", 1, [{("a", True), ("c", True)}, {("b", True), ("c", True)}]),
        ("a&b|c", 1, [{("a", True), ("b", True)}, {("c", True)}]),
        ("a|(b&c)", 1, [{("a", True)}, {("b", True), ("c", True)}]),
        ("a&!b", 2, [{("a", True), ("b", False)}]),
        ("a&!a|b", 1, [{("b", True)}]),  # the contradiction is dropped
        ("[a|b]", 1, [{("a", True)}, {("b", True)}]),  # matching OR on one node is plain OR
        ("[a&b]", 4, [{("a", True), ("b", True)}]),  # one alternative: every node has it anyway
        ("rack-1.x&gpu_a100", 1, [{("rack-1.x", True), ("gpu_a100", True)}]),
    ],
)
def test_parse_constraint(text: str, nodes: int, terms: list[set[tuple[str, bool]]]) -> None:
    assert [set(t) for t in parse_constraint(text, nodes)] == terms


@pytest.mark.parametrize(
    ("text", "nodes", "why"),
    [
        ("gpu*2", 2, "feature counts"),
        ("[a*2&b*1]", 3, "feature counts"),
        ("(a|b)*2", 2, "feature counts"),
        ("[a|b]", 2, "matching OR"),
        ("a,b", 1, "','"),
        ("!(a&b)", 1, "negate"),
        ("a&(b|c", 1, "parentheses"),
        ("a&", 1, "unexpected"),
        ("a&!a", 1, "ever satisfy"),
        ("(a|b)&(c|d)&(e|f)&(g|h)&(i|j)&(k|l)&(m|n)", 1, "alternatives"),
    ],
)
def test_untranslatable_constraints_are_refused_with_a_reason(
    text: str, nodes: int, why: str
) -> None:
    with pytest.raises(Untranslatable, match=re.escape(why)):
        parse_constraint(text, nodes)


def test_untranslatable_jobs_are_named_with_the_reason() -> None:
    assert "feature counts" in untranslatable(FMT_JOBS[37])  # -N2 --constraint=gpu*2
    assert untranslatable(FMT_JOBS[36]) == ""  # [gpu|cpu] on one node is fine
    with pytest.raises(Untranslatable):
        job_to_spec(FMT_JOBS[37], muster_id="slurm-37", queue="q")
    multi = SlurmJob(
        job_id=1, state="PENDING", partition="staging", num_nodes=2, features="[gpu|cpu]"
    )
    assert "matching OR" in untranslatable(multi)
    assert all(untranslatable(FMT_JOBS[i]) == "" for i in FMT_JOBS if i != 37)


def test_mem_and_tasks_per_node_as_slurm_allocates_them() -> None:
    # --mem is per node: -N4 --mem=2G -> tres mem=8G -> 2Gi a node.
    assert per_node_request(FMT_JOBS[28])["memory"] == "2Gi"
    # --mem-per-cpu=512M, -N2 --ntasks-per-node=2 -c3: 12 CPUs -> 6 a node, 6 x 512M = 3Gi a node.
    assert FMT_JOBS[29].tasks_per_node == 2
    assert per_node_request(FMT_JOBS[29]) == {"cpu": "6", "memory": "3Gi", "nvidia.com/gpu": "2"}
    # -N2 --ntasks-per-node=4 --mem=3G: 8 tasks of 1 CPU, 4 a node, 3Gi a node.
    assert FMT_JOBS[41].tasks_per_node == 4
    assert per_node_request(FMT_JOBS[41]) == {"cpu": "4", "memory": "3Gi"}
    # --gpus-per-task=1 --ntasks=2 on one node: 2 GPUs there (the JSON path agrees: tasks/nodes).
    assert (
        per_node_request(FMT_JOBS[30])["nvidia.com/gpu"]
        == "2"
        == per_node_request(JSON_JOBS[30])["nvidia.com/gpu"]
    )
    # -N2 -n3: Slurm puts 2 tasks on one node, so each node must offer 2 CPUs (rounded up).
    assert per_node_request(FMT_JOBS[40])["cpu"] == "2"
    # --mem=0: all of a node's memory (RealMemory 256000 MB): tres mem=500G over 2 nodes.
    assert parse_resources(per_node_request(FMT_JOBS[39]))["memory"] == 256000 * 1024**2


def test_foreign_exclusive_job_holds_the_whole_node() -> None:
    node = node_to_pb(
        next(n for n in parse_sinfo_json(read("sinfo_states.json")) if n.name == "n1")
    )
    job = SlurmJob(
        job_id=9,
        state="RUNNING",
        partition="batch",
        num_nodes=1,
        cpus=32,
        memory_bytes=32 * 1024**3,
        gres_per_node={"gpu": 1},
        nodes=["n1"],
        oversubscribe="NO",
    )
    (task,) = foreign_tasks(job, {"n1": node})
    assert task.request == node.allocatable  # Slurm gave it every CPU and all 4 GPUs (scontrol -d)
    job.oversubscribe = "OK"
    (task,) = foreign_tasks(job, {"n1": node})
    assert dict(task.request.quantities) == {"cpu": "32", "memory": "32Gi", "nvidia.com/gpu": "1"}


def test_feature_labels_match_between_nodes_and_constraints() -> None:
    job = SlurmJob(job_id=1, state="PENDING", partition="staging", num_nodes=1, features="gpu")
    node = node_to_pb(
        next(n for n in parse_sinfo_json(read("sinfo_states.json")) if n.name == "n1")
    )
    (term,) = (
        job_to_spec(job, muster_id="slurm-1", queue="q")
        .task_groups[0]
        .affinity.node_affinity.required
    )
    assert all(node.labels.get(r.key) == "true" for r in term.match_expressions)
    assert feature_label("gpu") == GPU


def test_squeue_lines_seen_before_are_not_parsed_again() -> None:
    """A poll passes the last poll's lines: an unchanged line gives the same job object, a changed
    one a new job, and the lines kept are this output's only."""
    text = read("squeue_fmt.txt")
    known: dict[str, Any] = {}
    first = parse_squeue_format(text, known)
    again = parse_squeue_format(text, known)
    assert [j.job_id for j in again] == [j.job_id for j in first]
    assert all(a is b for a, b in zip(again, first, strict=True))
    assert parse_squeue_format(text) == first  # the same jobs as a fresh parse
    lines = [line for line in text.splitlines() if line.strip()]
    changed = lines[1].replace("|PENDING|", "|RUNNING|", 1)
    assert changed != lines[1]
    later = parse_squeue_format("\n".join([changed, *lines[2:]]), known)
    assert later[0] is not first[1]
    assert later[0].state == "RUNNING"
    assert later[0].job_id == first[1].job_id
    assert all(a is b for a, b in zip(later[1:], first[2:], strict=True))
    assert set(known) == {changed, *lines[2:]}
