"""Every bad input gets the right gRPC status, a message naming the field, and changes nothing."""

from __future__ import annotations

import grpc
import pytest
from server_test_helpers import gang, node, register, rl, rpc_error, status_deltas

from muster.v1 import muster_pb2 as pb

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def tg(role: str = "worker", replicas: int = 1, **request: str) -> pb.TaskGroup:
    return pb.TaskGroup(role=role, replicas=replicas, request=rl(**(request or {"cpu": "1"})))


BAD_JOBS = [
    (
        "malformed quantity",
        pb.JobSpec(
            id="j", task_groups=[tg(), pb.TaskGroup(role="ps", replicas=1, request=rl(cpu="2x"))]
        ),
        INVALID,
        "job.task_groups[1].request.cpu",
    ),
    (
        "negative request",
        pb.JobSpec(id="j", task_groups=[tg(cpu="-1")]),
        INVALID,
        "job.task_groups[0].request.cpu",
    ),
    (
        "all-zero request",
        pb.JobSpec(id="j", task_groups=[tg(cpu="0", memory="0")]),
        INVALID,
        "job.task_groups[0].request",
    ),
    (
        "empty request",
        pb.JobSpec(id="j", task_groups=[pb.TaskGroup(role="w", replicas=1)]),
        INVALID,
        "job.task_groups[0].request",
    ),
    (
        "bad resource name",
        pb.JobSpec(id="j", task_groups=[tg(**{"bad name": "1"})]),
        INVALID,
        "job.task_groups[0].request",
    ),
    (
        "zero replicas",
        pb.JobSpec(id="j", task_groups=[tg(replicas=0)]),
        INVALID,
        "job.task_groups[0].replicas",
    ),
    (
        "negative replicas",
        pb.JobSpec(id="j", task_groups=[tg(replicas=-3)]),
        INVALID,
        "job.task_groups[0].replicas",
    ),
    (
        "min_member > tasks",
        pb.JobSpec(id="j", min_member=3, task_groups=[tg(replicas=2)]),
        INVALID,
        "job.min_member",
    ),
    (
        "min_task_member unknown role",
        pb.JobSpec(id="j", min_task_member={"ps": 1}, task_groups=[tg()]),
        INVALID,
        "job.min_task_member['ps']",
    ),
    (
        "min_task_member > replicas",
        pb.JobSpec(id="j", min_task_member={"worker": 3}, task_groups=[tg(replicas=2)]),
        INVALID,
        "job.min_task_member['worker']",
    ),
    ("empty id", pb.JobSpec(id="", task_groups=[tg()]), INVALID, "job.id"),
    ("bad id", pb.JobSpec(id="a/b", task_groups=[tg()]), INVALID, "job.id"),
    ("no task groups", pb.JobSpec(id="j"), INVALID, "job.task_groups"),
    (
        "empty role",
        pb.JobSpec(id="j", task_groups=[tg(role="")]),
        INVALID,
        "job.task_groups[0].role",
    ),
    (
        "duplicate role",
        pb.JobSpec(id="j", task_groups=[tg(), tg()]),
        INVALID,
        "job.task_groups[1].role",
    ),
    (
        "unknown queue",
        pb.JobSpec(id="j", queue="nope", task_groups=[tg()]),
        grpc.StatusCode.NOT_FOUND,
        "job.queue",
    ),
    (
        "bad toleration",
        pb.JobSpec(
            id="j",
            task_groups=[
                pb.TaskGroup(
                    role="w",
                    replicas=1,
                    request=rl(cpu="1"),
                    tolerations=[pb.Toleration(key="k", operator="Maybe")],
                )
            ],
        ),
        INVALID,
        "job.task_groups[0].tolerations[0].operator",
    ),
    (
        "bad affinity operator",
        pb.JobSpec(
            id="j",
            task_groups=[
                pb.TaskGroup(
                    role="w",
                    replicas=1,
                    request=rl(cpu="1"),
                    affinity=pb.Affinity(
                        node_affinity=pb.NodeAffinity(
                            required=[
                                pb.NodeSelectorTerm(
                                    match_expressions=[
                                        pb.LabelSelectorRequirement(
                                            key="zone", operator="Near", values=["a"]
                                        )
                                    ]
                                )
                            ]
                        )
                    ),
                )
            ],
        ),
        INVALID,
        "job.task_groups[0].affinity.node_affinity.required[0].match_expressions[0].operator",
    ),
    (
        "sub_group undeclared",
        pb.JobSpec(
            id="j",
            task_groups=[pb.TaskGroup(role="w", replicas=1, request=rl(cpu="1"), sub_group="x")],
        ),
        INVALID,
        "job.task_groups[0].sub_group",
    ),
    (
        "negative duration",
        pb.JobSpec(
            id="j",
            task_groups=[
                pb.TaskGroup(role="w", replicas=1, request=rl(cpu="1"), duration_seconds=-1)
            ],
        ),
        INVALID,
        "job.task_groups[0].duration_seconds",
    ),
    (
        "bad min_resources",
        pb.JobSpec(id="j", min_resources=rl(memory="lots"), task_groups=[tg()]),
        INVALID,
        "job.min_resources.memory",
    ),
]


@pytest.mark.parametrize(("case", "spec", "code", "field"), BAD_JOBS, ids=[c[0] for c in BAD_JOBS])
async def test_bad_job_rejected_and_nothing_changes(stub, case, spec, code, field) -> None:
    err = await rpc_error(stub.SubmitJob(pb.SubmitJobRequest(job=spec)))
    assert err.code() == code, err.details()
    assert err.details().startswith(field), err.details()
    assert len((await stub.ListJobs(pb.ListJobsRequest())).jobs) == 0


async def test_submit_without_job_field(stub) -> None:
    err = await rpc_error(stub.SubmitJob(pb.SubmitJobRequest()))
    assert err.code() == INVALID
    assert err.details().startswith("job")


async def test_duplicate_id_idempotent_or_already_exists(stub) -> None:
    first = await stub.SubmitJob(pb.SubmitJobRequest(job=gang("dup", replicas=2)))
    assert first.created
    again = await stub.SubmitJob(
        pb.SubmitJobRequest(job=gang("dup", replicas=2, namespace="default", queue="default"))
    )
    assert not again.created
    assert again.job.spec.id == "dup"
    err = await rpc_error(stub.SubmitJob(pb.SubmitJobRequest(job=gang("dup", replicas=3))))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert err.details().startswith("job.id")
    job = await stub.GetJob(pb.GetJobRequest(id="dup"))
    assert len(job.tasks) == 2  # the original spec stands


async def test_unknown_backend_is_failed_precondition(stub) -> None:
    for call in (
        stub.SyncSnapshot(pb.SyncSnapshotRequest(backend="ghost", nodes=[node("n0")])),
        stub.SendDeltas(pb.SendDeltasRequest(backend="ghost")),
        stub.AckDecisions(
            pb.AckDecisionsRequest(backend="ghost", acks=[pb.DecisionAck(decision_id=1)])
        ),
    ):
        err = await rpc_error(call)
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert err.details().startswith("backend")
        assert "RegisterBackend" in err.details()
    stream = stub.StreamDecisions(pb.StreamDecisionsRequest(backend="ghost"))
    err = await rpc_error(stream.read())
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert len((await stub.ListNodes(pb.ListNodesRequest())).nodes) == 0


async def test_bad_deltas_change_nothing(stub) -> None:
    await register(stub, "a", [node("n0")])
    # A valid first delta followed by one for a node that does not exist: nothing is applied.
    err = await rpc_error(
        stub.SendDeltas(
            pb.SendDeltasRequest(
                backend="a",
                deltas=[
                    pb.Delta(node_upserted=node("n1")),
                    pb.Delta(node_removed="n9"),
                ],
            )
        )
    )
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert err.details().startswith("deltas[1].node_removed")
    names = [v.node.name for v in (await stub.ListNodes(pb.ListNodesRequest())).nodes]
    assert names == ["n0"]
    err = await rpc_error(
        stub.SendDeltas(
            status_deltas(
                "a",
                [pb.TaskStatusUpdate(task_id="nope/w-0", status=pb.TASK_STATUS_RUNNING, node="n0")],
            )
        )
    )
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert err.details().startswith("deltas[0].task_status.task_id")
    err = await rpc_error(
        stub.SendDeltas(
            pb.SendDeltasRequest(
                backend="a",
                deltas=[pb.Delta(node_upserted=pb.Node(name="n2", allocatable=rl(cpu="four")))],
            )
        )
    )
    assert err.code() == INVALID
    assert err.details().startswith("deltas[0].node_upserted.allocatable.cpu")
    err = await rpc_error(stub.SendDeltas(pb.SendDeltasRequest(backend="a", deltas=[pb.Delta()])))
    assert err.code() == INVALID
    assert err.details().startswith("deltas[0]")


async def test_node_owned_by_other_backend(stub) -> None:
    await register(stub, "a", [node("n0")])
    await stub.RegisterBackend(pb.RegisterBackendRequest(name="b", kind="fake-agent"))
    err = await rpc_error(
        stub.SyncSnapshot(pb.SyncSnapshotRequest(backend="b", nodes=[node("n0")]))
    )
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert err.details().startswith("nodes[0].name")
    views = (await stub.ListNodes(pb.ListNodesRequest())).nodes
    assert [(v.node.name, v.node.backend) for v in views] == [("n0", "a")]


async def test_sync_snapshot_bad_task(stub) -> None:
    await register(stub, "a", [node("n0")])
    err = await rpc_error(
        stub.SyncSnapshot(
            pb.SyncSnapshotRequest(
                backend="a",
                nodes=[node("n0"), node("n1")],
                tasks=[pb.BackendTask(task_id="x", node="n7", request=rl(cpu="1"))],
            )
        )
    )
    assert err.code() == INVALID
    assert err.details().startswith("tasks[0].node")
    assert [v.node.name for v in (await stub.ListNodes(pb.ListNodesRequest())).nodes] == ["n0"]


async def test_ack_unknown_decision(stub) -> None:
    await register(stub, "a", [node("n0")])
    err = await rpc_error(
        stub.AckDecisions(
            pb.AckDecisionsRequest(backend="a", acks=[pb.DecisionAck(decision_id=42)])
        )
    )
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert err.details().startswith("acks[0].decision_id")


async def test_queue_errors(stub) -> None:
    err = await rpc_error(
        stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="q", parent="missing")))
    )
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert err.details().startswith("queue.parent")
    err = await rpc_error(stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name=""))))
    assert err.code() == INVALID
    assert err.details().startswith("queue.name")
    err = await rpc_error(
        stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="q", capability=rl(cpu="x"))))
    )
    assert err.code() == INVALID
    assert err.details().startswith("queue.capability.cpu")
    err = await rpc_error(stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="default"))))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    err = await rpc_error(stub.UpdateQueue(pb.QueueRequest(queue=pb.Queue(name="ghost"))))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert err.details().startswith("queue.name")
    await stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="team")))
    await stub.CreateQueue(pb.QueueRequest(queue=pb.Queue(name="sub", parent="team")))
    err = await rpc_error(
        stub.UpdateQueue(pb.QueueRequest(queue=pb.Queue(name="team", parent="sub")))
    )
    assert err.code() == INVALID
    assert "cycle" in err.details()
    err = await rpc_error(stub.DeleteQueue(pb.DeleteQueueRequest(name="team")))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "child" in err.details()
    await stub.SubmitJob(pb.SubmitJobRequest(job=gang("in-sub", replicas=1, queue="sub")))
    err = await rpc_error(stub.DeleteQueue(pb.DeleteQueueRequest(name="sub")))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "jobs" in err.details()
    err = await rpc_error(stub.DeleteQueue(pb.DeleteQueueRequest(name="default")))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    err = await rpc_error(stub.DeleteQueue(pb.DeleteQueueRequest(name="")))
    assert err.code() == INVALID
    assert err.details().startswith("name")
    names = {q.queue.name for q in (await stub.ListQueues(pb.ListQueuesRequest())).queues}
    assert names == {"root", "default", "team", "sub"}


async def test_bad_page_token_and_ids(stub) -> None:
    err = await rpc_error(stub.ListJobs(pb.ListJobsRequest(page_token="garbage!")))
    assert err.code() == INVALID
    assert err.details().startswith("page_token")
    err = await rpc_error(stub.ListJobs(pb.ListJobsRequest(page_size=-1)))
    assert err.code() == INVALID
    assert err.details().startswith("page_size")
    err = await rpc_error(stub.GetJob(pb.GetJobRequest(id="")))
    assert err.code() == INVALID
    assert err.details().startswith("id")
    err = await rpc_error(stub.GetJob(pb.GetJobRequest(id="missing")))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    err = await rpc_error(stub.CancelJob(pb.CancelJobRequest(id="missing")))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    err = await rpc_error(stub.Explain(pb.ExplainRequest(job_id="missing")))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert err.details().startswith("job_id")
    err = await rpc_error(stub.RegisterBackend(pb.RegisterBackendRequest(name="", kind="x")))
    assert err.code() == INVALID
    assert err.details().startswith("name")


async def test_bad_config_and_scenario(stub) -> None:
    before = await stub.GetConfig(pb.GetConfigRequest())
    err = await rpc_error(stub.UpdateConfig(pb.UpdateConfigRequest(yaml="actions: [unclosed")))
    assert err.code() == INVALID
    assert err.details().startswith("yaml")
    assert (await stub.GetConfig(pb.GetConfigRequest())) == before
    err = await rpc_error(stub.Simulate(pb.SimulateRequest(scenario="")))
    assert err.code() == INVALID
    assert err.details().startswith("scenario")
    err = await rpc_error(stub.Simulate(pb.SimulateRequest(scenario="foo: 1\nbar: 2", cycles=1)))
    assert err.code() == INVALID  # ScenarioError problems, one per line
    assert "scenario.foo" in err.details()
    assert "scenario.bar" in err.details()
    err = await rpc_error(stub.Simulate(pb.SimulateRequest(scenario="nodes: []", cycles=-1)))
    assert err.code() == INVALID
    assert err.details().startswith("cycles")
