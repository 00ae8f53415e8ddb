"""The job controller: pods and PodGroups become Muster jobs.

Pods with ``spec.schedulerName == <scheduler name>`` are Muster's. A PodGroup's pods (Volcano,
coscheduling or KAI) become one job ``k8s:<ns>:<podgroup>`` with one TaskGroup per role (per KAI
sub-group and role for KAI); a pod without a group becomes a job of one, ``k8s:<ns>:pod:<name>``.
Gang pods wait until their PodGroup is seen and has ``minMember`` pods, and every KAI leaf
sub-group its own minimum (no partial placement). What Muster cannot schedule as asked (KAI's
``gpu-memory``, a required KAI topology constraint...) is refused: no job, a ``FailedScheduling``
Event on the pods saying why. Pods that join a gang after it was submitted run
as jobs of one (Volcano's elastic pods beyond minMember are scheduled individually too). Task ids
are the server's (``<job id>/<role>-<index>``); the pod behind each index is stored in the
TaskGroup annotation ``muster.dev/pods``, so an adapter restart recovers the mapping from the
server (GetJob) rather than guessing. A job whose pods (or PodGroup) are deleted is cancelled.

Changes mark a job key dirty; one pass at a time reconciles the dirty keys, and a pass that fails
(server away) is retried with backoff.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import anyio
import grpc
import structlog

from adapters.k8s import translate as tr
from adapters.k8s.common import (
    ITEM_ERRORS,
    AdapterStats,
    JobBook,
    JobKey,
    Obj,
    ServerLink,
    WorkQueue,
    server_backoff,
)
from adapters.k8s.informer import Informer
from adapters.k8s.snapshot import ClusterReporter
from adapters.k8s.status import StatusController
from muster.gang import api_min_member
from muster.v1 import muster_pb2 as pb

log = structlog.get_logger("muster.k8s")

VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"


class JobController:
    """Submits, adopts and cancels the Muster jobs behind Muster's pods; see the module docstring."""

    def __init__(
        self,
        server: ServerLink,
        book: JobBook,
        stats: AdapterStats,
        *,
        pods: Informer,
        podgroups: dict[str, Informer],
        priority_classes: Informer,
        reporter: ClusterReporter,
        status: StatusController,
        scheduler_name: str,
        backend_name: str,
    ) -> None:
        self.server = server
        self.book = book
        self.stats = stats
        self.pods = pods
        self.podgroups = podgroups
        self.priority_classes = priority_classes
        self.reporter = reporter
        self.status = status
        self.scheduler_name = scheduler_name
        self.backend_name = backend_name
        self.enabled = False  # set once the first snapshot has submitted everything
        self.group_members: dict[
            tuple[str, str], set[str]
        ] = {}  # (apiVersion, "ns/pg") -> pod keys
        self.submit_errors: dict[str, str] = {}  # job id -> why the server refused it
        self._dirty: WorkQueue[JobKey] = WorkQueue()
        self._lock = anyio.Lock()  # one reconciliation pass at a time

    # -- informer events ----------------------------------------------------------------------

    def is_own(self, pod: Obj) -> bool:
        return (pod.get("spec") or {}).get("schedulerName") == self.scheduler_name

    def on_pod(self, kind: str, pod: Obj, old: Obj | None) -> str | None:
        """Track gang membership and mark the pod's job dirty. Returns the pod's task id when it
        is one of ours and already mapped to a task."""
        key = tr.key_of(pod)
        group = tr.pod_group_ref(pod)
        old_group = tr.pod_group_ref(old) if old else None
        if old_group and old_group != group:
            self.group_members.get(old_group, set()).discard(key)
        if not self.is_own(pod):
            return None
        if group:
            members = self.group_members.setdefault(group, set())
            if kind == "DELETED":
                members.discard(key)
            else:
                members.add(key)
            self.mark(("group", group[0], group[1]))
        else:
            self.mark(("pod", "", key))
        return self.book.pod_task.get(key)

    def on_podgroup(self, api_version: str, podgroup: Obj) -> None:
        self.mark(("group", api_version, tr.key_of(podgroup)))

    def mark(self, key: JobKey) -> None:
        self._dirty.add(key)

    # -- passes -------------------------------------------------------------------------------

    async def run(self) -> None:
        backoff = server_backoff()
        while True:
            await self._dirty.wait()
            if not self.enabled:
                continue  # the first session's list_tasks submits everything
            keys = self._dirty.take()
            try:
                async with self._lock:
                    for key in sorted(keys):
                        await self._reconcile(key)
                backoff.reset()
            except Exception as exc:  # server away (or a bug): retry, never die
                self._dirty.requeue(keys)  # a pass runs again once the delay is over
                delay = backoff.next()
                if isinstance(exc, grpc.aio.AioRpcError):
                    log.info(
                        "job sync failed, retrying", code=exc.code().name, delay=round(delay, 2)
                    )
                else:
                    log.exception("job sync failed, retrying", delay=round(delay, 2))
                await anyio.sleep(delay)

    async def resubmit_all(self) -> None:
        """Rebuild the mapping from scratch: every pod of ours is submitted (or adopted) again."""
        async with self._lock:
            self.book.clear()
            self.reporter.forget_reports()
            keys = self._dirty.take()
            for pod_key, pod in self.pods.cache.items():
                if not self.is_own(pod):
                    continue
                group = tr.pod_group_ref(pod)
                keys.add(("group", group[0], group[1]) if group else ("pod", "", pod_key))
            for key in sorted(keys):
                await self._reconcile(key)

    async def _reconcile(self, key: JobKey) -> None:
        if key[0] == "group":
            await self._reconcile_group(key)
        else:
            await self._reconcile_single(key)

    def _live_own_pods(self, keys: Iterable[str]) -> list[Obj]:
        pods = []
        for k in keys:
            pod = self.pods.cache.get(k)
            if pod is not None and self.is_own(pod) and not tr.meta(pod).get("deletionTimestamp"):
                pods.append(pod)
        return pods

    async def _reconcile_group(self, key: JobKey) -> None:
        _, api_version, gkey = key
        ns, name = gkey.split("/", 1)
        job_id = tr.job_id_for_group(ns, name)
        informer = self.podgroups.get(api_version)
        podgroup = informer.cache.get(gkey) if informer is not None else None
        members = self._live_own_pods(self.group_members.get((api_version, gkey), set()))
        submitted = self.book.jobs.get(job_id)
        if podgroup is None:
            if submitted is not None:
                await self._cancel(job_id, "podgroup deleted")
            elif informer is None and members:
                self._refuse(
                    job_id,
                    members,
                    f"pods name {api_version} PodGroup {gkey}, which this adapter does not "
                    "read (start it with --kai to read KAI PodGroups)",
                )
            return  # gang pods wait for their PodGroup: no partial placement
        gang = tr.gang_spec(podgroup)
        if submitted is None:
            if not members:
                return
            problem = gang.problem or self._pods_problem(members, gang)
            if problem:
                self._refuse(job_id, members, problem)
                return
            anyone_bound = any(tr.pod_node(p) for p in members)
            if not anyone_bound and (
                len(members) < gang.minimum(len(members)) or self._sub_groups_short(members, gang)
            ):
                return  # Volcano and KAI: a gang is not schedulable until minMember pods exist
            queue = gang.queue or self._pod_queue(members[0])
            priority = self._priority(gang.priority_class, members)
            spec = self._job_spec(job_id, ns, name, members, queue, priority, gang)
            await self._submit(key, spec)
            self.status.mark(job_id)
            return
        # Pods that joined after the gang was submitted run as jobs of one (Volcano's elastic
        # pods beyond minMember are scheduled individually too).
        for pod in members:
            pod_key = tr.key_of(pod)
            if pod_key not in self.book.pod_task and not tr.pod_terminal(pod):
                extra_id = f"{job_id}:x:{tr.meta(pod)['name']}"
                problem = self._pods_problem([pod], None)
                if problem:
                    self._refuse(extra_id, [pod], problem)
                    continue
                spec = self._job_spec(
                    extra_id,
                    ns,
                    tr.meta(pod)["name"],
                    [pod],
                    gang.queue or self._pod_queue(pod),
                    self._priority(gang.priority_class, [pod]),
                    None,
                )
                await self._submit(("pod", "", pod_key), spec)
        if not members and all(self.pods.cache.get(k) is None for k in submitted.tasks.values()):
            await self._cancel(job_id, "every pod of the podgroup was deleted")
        self.status.mark(job_id)

    async def _reconcile_single(self, key: JobKey) -> None:
        pod_key = key[2]
        ns, name = pod_key.split("/", 1)
        job_id = tr.job_id_for_pod(ns, name)
        pod = self.pods.cache.get(pod_key)
        submitted = self.book.jobs.get(job_id)
        if pod is None or not self.is_own(pod) or tr.meta(pod).get("deletionTimestamp"):
            if submitted is not None and not (pod is not None and tr.pod_node(pod)):
                await self._cancel(job_id, "pod deleted")
            return
        if submitted is None and pod_key not in self.book.pod_task:
            if tr.pod_terminal(pod):
                return
            problem = self._pods_problem([pod], None) or tr.pod_topology(pod).problem(
                f"pod {pod_key}"
            )
            if problem:
                self._refuse(job_id, [pod], problem)
                return
            spec = self._job_spec(
                job_id, ns, name, [pod], self._pod_queue(pod), self._priority("", [pod]), None
            )
            await self._submit(key, spec)
        self.status.mark(job_id)

    # -- job specs ----------------------------------------------------------------------------

    def _pod_queue(self, pod: Obj) -> str:
        return (
            (tr.meta(pod).get("annotations") or {}).get(VOLCANO_QUEUE_ANNOTATION)
            or tr.pod_queue_label(pod)
            or "default"
        )

    @staticmethod
    def _pods_problem(pods: list[Obj], gang: tr.GangSpec | None) -> str:
        """Why Muster cannot schedule these pods as asked ("" when it can): KAI GPU-sharing
        requests it does not support, a pod in a sub-group its PodGroup does not define."""
        problems = []
        for pod in sorted(pods, key=tr.key_of):
            problems.append(tr.pod_gpu_problem(pod))
            if gang is None:
                problems.append(tr.pod_preemptibility(pod)[1])
            elif gang.all_sub_groups and (sub := tr.pod_sub_group(pod)):
                if sub not in gang.all_sub_groups:
                    problems.append(
                        f"pod {tr.key_of(pod)}: sub-group {sub!r} is not defined by its PodGroup"
                    )
                elif sub not in gang.sub_groups:
                    problems.append(
                        f"pod {tr.key_of(pod)}: sub-group {sub!r} has sub-groups; pods belong to leaves"
                    )
        return "; ".join(p for p in problems if p)

    @staticmethod
    def _sub_groups_short(pods: list[Obj], gang: tr.GangSpec) -> bool:
        """KAI: is some leaf sub-group still short of its minimum of pods?"""
        counts = Counter(tr.pod_sub_group(pod) for pod in pods)
        return any(counts[sub] < need for sub, need in gang.sub_groups.items())

    def _refuse(self, job_id: str, pods: Iterable[Obj], reason: str, **log_fields: str) -> None:
        """Muster (the adapter or the server) cannot run these pods as asked: no job; say why,
        once per distinct reason."""
        message = f"muster refused job {job_id}: {reason}"
        if self.submit_errors.get(job_id) == message:
            return
        self.submit_errors[job_id] = message
        log.warning("job refused", job=job_id, **log_fields, details=reason)
        for pod in pods:
            self.status.emit_event(pod, "FailedScheduling", message, "Warning")

    def _priority(self, priority_class: str, pods: list[Obj]) -> int:
        if priority_class:
            pc = self.priority_classes.cache.get(priority_class)
            if pc is not None:
                return tr.priority_value(pc)
        for pod in pods:
            spec = pod.get("spec") or {}
            if spec.get("priority") is not None:
                return int(spec["priority"])
            pc = self.priority_classes.cache.get(spec.get("priorityClassName") or "")
            if pc is not None:
                return tr.priority_value(pc)
        return 0

    def _job_spec(
        self,
        job_id: str,
        ns: str,
        name: str,
        pods: list[Obj],
        queue: str,
        priority: int,
        gang: tr.GangSpec | None,
    ) -> pb.JobSpec:
        sub_groups = gang.sub_groups if gang is not None else {}
        by_role: dict[str, list[Obj]] = {}
        role_sub: dict[str, str] = {}
        for pod in pods:
            role, sub = tr.pod_role(pod), tr.pod_sub_group(pod) if sub_groups else ""
            if sub:  # KAI: one task group per (sub-group, role)
                role = sub if role == tr.DEFAULT_ROLE else f"{sub}.{role}"
                role_sub[role] = sub
            by_role.setdefault(role, []).append(pod)
        groups = [
            tr.task_group(role, by_role[role], role_sub.get(role, "")) for role in sorted(by_role)
        ]
        total = len(pods)
        spec = pb.JobSpec(
            id=job_id,
            namespace=ns,
            name=name,
            queue=queue,
            priority=priority,
            task_groups=groups,
            min_member=total,
            annotations={"muster.dev/backend": self.backend_name},
            time_limit_seconds=tr.pods_time_limit(pods),  # their activeDeadlineSeconds
        )
        if gang is not None:
            spec.min_member = api_min_member(gang.minimum(total), total)
            spec.sub_groups.extend(
                pb.SubGroup(name=sub, min_member=n) for sub, n in sorted(sub_groups.items())
            )
            if gang.preemptible is not None:
                spec.preemptible = gang.preemptible
            for role, count in gang.min_task_member.items():
                if role in by_role:
                    spec.min_task_member[role] = min(count, len(by_role[role]))
            if gang.min_resources:
                spec.min_resources.CopyFrom(pb.ResourceList(quantities=gang.min_resources))
        else:  # a job of one: KAI reads the pod's own label (the pod is its top owner)
            preemptible, _ = tr.pod_preemptibility(pods[0])
            if preemptible is not None:
                spec.preemptible = preemptible
        return spec

    # -- server calls -------------------------------------------------------------------------

    async def _submit(self, key: JobKey, spec: pb.JobSpec) -> None:
        stub = self.server.stub
        try:
            reply = await stub.SubmitJob(pb.SubmitJobRequest(job=spec))
            job = reply.job
            self.stats.submits += 1
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.ALREADY_EXISTS:
                # Submitted earlier with other pods (an adapter restart after pods changed): adopt
                # the server's job and its task <-> pod mapping.
                job = await stub.GetJob(pb.GetJobRequest(id=spec.id))
            elif exc.code() in ITEM_ERRORS:
                pods = self._live_own_pods(
                    [
                        f"{spec.namespace}/{n}"
                        for tg in spec.task_groups
                        for n in tg.annotations[tr.PODS_ANNOTATION].split(",")
                    ]
                )
                self._refuse(spec.id, pods, str(exc.details()), code=exc.code().name)
                return
            else:
                raise
        self.submit_errors.pop(spec.id, None)
        self._adopt(key, job)

    def _adopt(self, key: JobKey, job: pb.Job) -> None:
        names = {
            tg.role: tg.annotations.get(tr.PODS_ANNOTATION, "").split(",")
            for tg in job.spec.task_groups
        }
        submitted = self.book.job(job.spec.id, key)
        for task in job.tasks:
            pods = names.get(task.role) or []
            if task.index < len(pods) and pods[task.index]:
                self.book.link(submitted, task.id, f"{job.spec.namespace}/{pods[task.index]}")
        self.status.seen(job)
        # Report what happened to the pods meanwhile (e.g. Running) once the mapping exists.
        for task_id, pod_key in submitted.tasks.items():
            self.reporter.mapped(task_id, pod_key)

    async def _cancel(self, job_id: str, why: str) -> None:
        self.book.drop(job_id)
        try:
            await self.server.stub.CancelJob(pb.CancelJobRequest(id=job_id))
            log.info("job cancelled", job=job_id, why=why)
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in ITEM_ERRORS:
                raise
