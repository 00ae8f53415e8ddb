"""Muster jobs run on Slurm without ``sbatch`` by the user ("native" jobs; pure functions).

A job submitted to Muster directly (``muster submit``, SubmitJobs) whose tasks Muster binds to
this adapter's nodes becomes ONE Slurm job at bind time: ``sbatch --partition=<run>
--nodelist=<the binds' nodes> --nodes=K --ntasks-per-node=1`` run as the adapter's
``--native-jobs-user``. This is Armada's model: the job lives in the scheduler until it is
placed, and only then does the cluster see it, so clients of Muster's API (any language) run
jobs on Slurm without ``sbatch``.

The Slurm job's ``--comment`` carries :data:`NATIVE_MARKER`, the Muster job id and each task's
node, so a restarted adapter recognises what it submitted (jobs of the native user only).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from adapters.slurm.translate import ANNOTATION, GPU_RESOURCE, Untranslatable
from muster.quantity import MEMORY, QuantityError, parse_resources
from muster.timelimit import slurm_time
from muster.v1 import muster_pb2 as pb

NATIVE_MARKER = "muster-native:"
# Task annotations the Slurm job takes: its output file and working directory.
OUTPUT_ANNOTATION = ANNOTATION + "output"
WORKDIR_ANNOTATION = ANNOTATION + "chdir"
_GRES_PREFIX = "slurm.schedmd.com/"
_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class NativeJob:
    """One Slurm job for binds of one Muster job that arrived together: task i on node i, each
    node asked for the same (the largest of the binds' requests, as Slurm asks per node)."""

    job_id: str
    tasks: tuple[str, ...]
    nodes: tuple[str, ...]
    cpus: int
    memory_mib: int  # 0: none requested (Slurm's default applies)
    gres: tuple[tuple[str, int], ...]  # (Slurm GRES name, count per node)
    wrap: str  # the shell line ``--wrap`` runs
    output: str = ""  # '' -> Slurm's default (slurm-%j.out in the working directory)
    workdir: str = ""  # '' -> the adapter's default (``sbatch_argv``'s ``workdir``)
    time_limit: int = 0  # seconds (``--time``; Slurm rounds up to whole minutes); 0: none

    @property
    def comment(self) -> str:
        pairs = ",".join(
            f"{task}@{node}" for task, node in zip(self.tasks, self.nodes, strict=True)
        )
        return f"{NATIVE_MARKER}{self.job_id}|{pairs}"

    def sbatch_argv(self, *, partition: str, user: str, group: str, workdir: str) -> list[str]:
        argv = [
            "sbatch",
            "--parsable",
            f"--partition={partition}",
            f"--nodelist={','.join(self.nodes)}",
            f"--nodes={len(self.nodes)}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={self.cpus}",
            f"--job-name={self.job_id}",
            f"--comment={self.comment}",
            f"--uid={user}",
            f"--gid={group}",
        ]
        if self.memory_mib:
            argv.append(f"--mem={self.memory_mib}M")
        if self.gres:
            argv.append("--gres=" + ",".join(f"{name}:{count}" for name, count in self.gres))
        if self.output:
            argv.append(f"--output={self.output}")
        if self.workdir or workdir:
            argv.append(f"--chdir={self.workdir or workdir}")
        if self.time_limit:
            argv.append(f"--time={slurm_time(self.time_limit)}")
        argv.append(f"--wrap={self.wrap}")
        return argv


def binds_needed(binds: Sequence[pb.BindDecision]) -> int:
    """How many of a job's binds Slurm needs together to run it as one allocation: the job's gang
    minimum as the binds carry it, already resolved by the server (``muster.gang.gang_minimum``),
    so nothing is resolved here; at least one (a bind from a server that did not send it)."""
    return max((b.min_member for b in binds), default=0) or 1


def native_job(job_id: str, binds: Sequence[pb.BindDecision]) -> NativeJob:
    """The Slurm job for ``binds`` (one Muster job's, arrived together); raises
    :class:`~adapters.slurm.translate.Untranslatable` saying why Slurm cannot run them as one job."""
    if not binds:
        raise Untranslatable("no binds")
    need = binds_needed(binds)
    if len(binds) < need:
        raise Untranslatable(
            f"gang incomplete: {len(binds)} of {need} binds arrived together "
            "(Slurm runs a gang as one allocation)"
        )
    ordered = sorted(binds, key=lambda b: b.task_id)
    nodes = [b.node for b in ordered]
    if len(set(nodes)) != len(nodes):
        twice = sorted({n for n in nodes if nodes.count(n) > 1})
        raise Untranslatable(
            f"two tasks of job {job_id} bound to {','.join(twice)}: a Slurm job runs one "
            "task per node here"
        )
    commands = {tuple(b.command) for b in ordered}
    if len(commands) > 1:
        raise Untranslatable(
            f"the tasks of job {job_id} run different commands: one Slurm job runs one"
        )
    cpus, memory = 1, 0.0
    gres: dict[str, int] = {}
    for b in ordered:
        try:
            request = parse_resources(b.request.quantities)
        except QuantityError as exc:
            raise Untranslatable(f"task {b.task_id}: request.{exc}") from None
        for name, value in request.items():
            if name == "cpu":
                cpus = max(cpus, math.ceil(value / 1000))
            elif name == MEMORY:
                memory = max(memory, value)
            elif name == GPU_RESOURCE or name.startswith(_GRES_PREFIX):
                gres_name = "gpu" if name == GPU_RESOURCE else name[len(_GRES_PREFIX) :]
                gres[gres_name] = max(gres.get(gres_name, 0), math.ceil(value / 1000))
            elif value > 0:
                raise Untranslatable(f"task {b.task_id}: Slurm has no resource for request.{name}")
    first = ordered[0]
    command = list(first.command)
    if command:
        wrap = shlex.join(command)
    elif first.duration_seconds > 0:
        wrap = f"sleep {first.duration_seconds:g}"
    else:
        wrap = "true"
    wrap = _with_env(wrap, first.env)
    return NativeJob(
        job_id=job_id,
        tasks=tuple(b.task_id for b in ordered),
        nodes=tuple(nodes),
        cpus=cpus,
        memory_mib=math.ceil(memory / _MIB) if memory else 0,
        gres=tuple(sorted((n, c) for n, c in gres.items() if c > 0)),
        wrap=wrap,
        output=first.annotations.get(OUTPUT_ANNOTATION, ""),
        workdir=first.annotations.get(WORKDIR_ANNOTATION, ""),
        time_limit=first.time_limit_seconds,
    )


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _with_env(wrap: str, env: Mapping[str, str]) -> str:
    """The bind's environment (an array element's MUSTER_ARRAY_JOB_ID / MUSTER_ARRAY_INDEX)
    exported before the command: ``--wrap`` runs one shell line."""
    names = sorted(k for k in env if _ENV_NAME.match(k))
    if not names:
        return wrap
    return "export " + " ".join(f"{k}={shlex.quote(env[k])}" for k in names) + "; " + wrap


def parse_comment(comment: str) -> tuple[str, list[str], list[str]] | None:
    """A native job's ``--comment`` -> (Muster job id, task ids, nodes); None if it is not one."""
    if not comment.startswith(NATIVE_MARKER):
        return None
    job_id, sep, pairs = comment[len(NATIVE_MARKER) :].partition("|")
    if not sep or not job_id or not pairs:
        return None
    tasks, nodes = [], []
    for pair in pairs.split(","):
        task, at, node = pair.rpartition("@")
        if not at or not task or not node:
            return None
        tasks.append(task)
        nodes.append(node)
    return job_id, tasks, nodes
