"""What the Kubernetes adapter's controllers share: the pod <-> task book, the adapter's own
channel to the Muster server, counters, and the few constants of the mapping."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import anyio
import grpc

from adapters.k8s import translate as tr
from adapters.retry import Backoff
from muster import transport
from muster.transport import ClientTls
from muster.v1 import muster_pb2_grpc as pb_grpc

Obj = dict[str, Any]
# A job key: ("group", podgroup apiVersion, "ns/name") or ("pod", "", "ns/name").
JobKey = tuple[str, str, str]

# Server answers meaning "this item is wrong", as opposed to "the server is away".
ITEM_ERRORS = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
)
PODGROUP_APIS = {
    tr.VOLCANO_PODGROUP: ("scheduling.volcano.sh", "v1beta1"),
    tr.COSCHEDULING_PODGROUP: ("scheduling.x-k8s.io", "v1alpha1"),
    tr.KAI_PODGROUP: ("scheduling.run.ai", "v2alpha2"),
}


K = TypeVar("K")


class WorkQueue(Generic[K]):
    """Keys of objects that changed and wait for a controller's pass (client-go's workqueue, in
    small): adding a key twice before the pass runs it once."""

    def __init__(self) -> None:
        self.keys: set[K] = set()
        self._wake = anyio.Event()

    def add(self, key: K) -> None:
        self.keys.add(key)
        self._wake.set()

    def requeue(self, keys: set[K]) -> None:
        """Put keys back (their pass failed) and run a pass again."""
        self.keys |= keys
        self._wake.set()

    async def wait(self) -> None:
        """Until a key is added (or a pass asked to run again)."""
        await self._wake.wait()
        self._wake = anyio.Event()

    def take(self) -> set[K]:
        """Every waiting key, removed from the queue."""
        keys, self.keys = self.keys, set()
        return keys


def server_backoff() -> Backoff:
    """The wait before retrying a call to the Muster server: 0.4 s doubling to 5 s, jittered."""
    return Backoff(initial=0.4, factor=2.0, max=5.0, jitter=0.5)


@dataclass(slots=True)
class SubmittedJob:
    job_id: str
    key: JobKey
    tasks: dict[str, str] = field(default_factory=dict)  # task id -> pod key


@dataclass(slots=True)
class AdapterStats:
    binds: int = 0
    bind_rejects: int = 0
    evictions: int = 0
    evict_rejects: int = 0
    submits: int = 0
    status_patches: int = 0
    events: int = 0


class JobBook:
    """Which Muster job and task each pod is. Written by the job controller; read by the others."""

    def __init__(self) -> None:
        self.jobs: dict[str, SubmittedJob] = {}
        self.task_pod: dict[str, str] = {}  # task id -> pod key
        self.pod_task: dict[str, str] = {}  # pod key -> task id

    def job(self, job_id: str, key: JobKey) -> SubmittedJob:
        """The job ``job_id``, recorded under ``key`` if it is new."""
        return self.jobs.setdefault(job_id, SubmittedJob(job_id, key))

    def link(self, job: SubmittedJob, task_id: str, pod_key: str) -> None:
        job.tasks[task_id] = pod_key
        self.task_pod[task_id] = pod_key
        self.pod_task[pod_key] = task_id

    def drop(self, job_id: str) -> None:
        """Forget a job and its tasks' pods."""
        job = self.jobs.pop(job_id, None)
        if job is None:
            return
        for task_id, pod_key in job.tasks.items():
            self.task_pod.pop(task_id, None)
            if self.pod_task.get(pod_key) == task_id:
                self.pod_task.pop(pod_key, None)

    def clear(self) -> None:
        self.jobs.clear()
        self.task_pod.clear()
        self.pod_task.clear()


class ServerLink:
    """The adapter's own channel to the Muster server (jobs, queues, watches), beside the
    runtime's; opened and closed by :meth:`K8sBackend.run <adapters.k8s.adapter.K8sBackend.run>`."""

    def __init__(
        self, address: str, tls: ClientTls | None = None, token: str | None = None
    ) -> None:
        self.address = address
        self.tls = tls
        self.token = token
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.SchedulerStub | None = None

    def open(self) -> None:
        self._channel = transport.channel(self.address, self.tls, token=self.token)
        self._stub = pb_grpc.SchedulerStub(self._channel)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(grace=None)

    @property
    def stub(self) -> pb_grpc.SchedulerStub:
        assert self._stub is not None, "run() first"
        return self._stub
