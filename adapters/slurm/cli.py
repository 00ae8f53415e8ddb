"""Slurm's command line as async subprocesses (Slurm 22.05 has no usable API for placement).

pyslurm has no 22.05 build and slurmrestd 22.05 refuses ``required_nodes``, so every call is a
``sinfo`` / ``squeue`` / ``scontrol`` process (about 6 ms each). Calls are bounded by a timeout
and by a concurrency limit, so a burst of enforcement calls cannot fork-bomb a small host.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import structlog

from adapters.slurm.parse import (
    SQUEUE_FORMAT,
    JobRecord,
    SlurmJob,
    SlurmNode,
    parse_scontrol_job,
    parse_sinfo_json,
    parse_squeue_format,
    parse_squeue_json,
)
from muster.timelimit import slurm_time

log = structlog.get_logger("muster.slurm")

# Every squeue state but the final ones (parse.FINISHED_STATES): what the poll reads. Finished jobs
# stay listed for MinJobAge (thousands on a busy cluster), and the poll needs only the few it
# tracks, which it looks up by id.
LIVE_STATES = (
    "PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING,RESIZING,RESV_DEL_HOLD,REQUEUED,"
    "REQUEUE_FED,REQUEUE_HOLD,SIGNALING,STAGE_OUT,STOPPED"
)


def placement_words(
    job_id: int, partition: str, nodes: Sequence[str], marker: str = "", time_limit: int = 0
) -> list[str]:
    """``update JobId=N Partition=<run> NodeList=<nodes> StartTime=now [AdminComment=<marker>]
    [TimeLimit=D-HH:MM:SS]``: the scontrol command that places a staged job. ``StartTime=now``
    undoes the ~2 min EligibleTime a requeue leaves behind; ``TimeLimit`` is Muster's time limit
    for the job (0: the job keeps its own)."""
    words = [
        "update",
        f"JobId={job_id}",
        f"Partition={partition}",
        f"NodeList={','.join(nodes)}",
        "StartTime=now",
    ]
    if marker:
        words.append(f"AdminComment={marker}")
    if time_limit:
        words.append(f"TimeLimit={slurm_time(time_limit)}")
    return words


class SlurmError(Exception):
    """A Slurm command failed; ``str()`` is Slurm's own message (stderr, else stdout)."""

    def __init__(self, argv: Sequence[str], returncode: int, message: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.message = message.strip() or f"exit status {returncode}"
        super().__init__(self.message)


@dataclass(slots=True)
class Result:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


class SlurmCLI:
    """Thin async wrappers over the Slurm commands the adapter needs."""

    def __init__(self, *, bin_dir: str = "", timeout: float = 30.0, parallel: int = 4) -> None:
        self.bin_dir = bin_dir
        self.timeout = timeout
        self.parallel = parallel
        self._limit = anyio.CapacityLimiter(parallel)
        self.calls = 0
        # The last poll's squeue lines and their jobs: an unchanged line is not parsed again.
        self._polled_lines: dict[str, SlurmJob] = {}

    def _argv(self, argv: Sequence[str]) -> list[str]:
        return [os.path.join(self.bin_dir, argv[0]) if self.bin_dir else argv[0], *argv[1:]]

    async def run(self, *argv: str, check: bool = True, stdin: bytes | None = None) -> Result:
        full = self._argv(argv)
        started = time.perf_counter()
        async with self._limit:
            self.calls += 1
            try:
                with anyio.fail_after(self.timeout):
                    proc = await anyio.run_process(
                        full, input=stdin, check=False, env={**os.environ, "LC_ALL": "C"}
                    )
            except TimeoutError:
                raise SlurmError(
                    full, -1, f"{argv[0]} timed out after {self.timeout:.0f} s"
                ) from None
            except OSError as exc:
                raise SlurmError(full, -1, f"cannot run {argv[0]}: {exc}") from None
        result = Result(
            proc.returncode,
            proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
            time.perf_counter() - started,
        )
        if check and result.returncode != 0:
            raise SlurmError(full, result.returncode, result.stderr or result.stdout)
        return result

    # -- reading ------------------------------------------------------------------------------

    async def nodes(self, partition: str = "") -> list[SlurmNode]:
        argv = ["sinfo", "--json"]
        if partition:
            argv += ["-p", partition]
        nodes = parse_sinfo_json((await self.run(*argv)).stdout)
        if partition:  # 22.05's --json may ignore -p like squeue ignores -t: filter here too
            nodes = [n for n in nodes if not n.partitions or partition in n.partitions]
        return nodes

    async def jobs(self, *, states: str = "all") -> list[SlurmJob]:
        """The cheap poll (honours filters). ``states`` as for ``squeue -t``."""
        out = await self.run("squeue", "-h", "-a", "-t", states, "-O", SQUEUE_FORMAT)
        return parse_squeue_format(out.stdout, self._polled_lines)

    async def jobs_by_id(
        self, job_ids: Sequence[int], *, missing_ok: bool = False
    ) -> list[SlurmJob]:
        """The poll's fields for just these jobs, any state: one process verifies a whole burst.

        squeue leaves out ids Slurm no longer knows, but fails when it knows none of them
        ("Invalid job id specified"): with ``missing_ok`` that is an empty answer."""
        ids = ",".join(str(i) for i in job_ids)
        try:
            out = await self.run("squeue", "-h", "-a", "-t", "all", "-j", ids, "-O", SQUEUE_FORMAT)
        except SlurmError as exc:
            if missing_ok and exc.returncode > 0 and "Invalid job id" in exc.message:
                return []
            raise
        return parse_squeue_format(out.stdout)

    async def jobs_named(self, name: str, user: str, *, states: str) -> list[SlurmJob]:
        """The poll's fields for ``user``'s jobs called ``name`` in ``states``."""
        out = await self.run(
            "squeue", "-h", "-a", "-t", states, "-n", name, "-u", user, "-O", SQUEUE_FORMAT
        )
        return parse_squeue_format(out.stdout)

    async def jobs_full(self) -> list[SlurmJob]:
        """Every job with every field (incl. AdminComment); used for the start-up re-sync."""
        return parse_squeue_json((await self.run("squeue", "--json")).stdout)

    async def show_job(self, job_id: int) -> JobRecord:
        return parse_scontrol_job(
            (await self.run("scontrol", "show", "job", "-o", str(job_id))).stdout
        )

    # -- acting -------------------------------------------------------------------------------

    async def place(
        self,
        job_id: int,
        partition: str,
        nodes: Sequence[str],
        marker: str = "",
        time_limit: int = 0,
    ) -> None:
        """The one enforcement RPC: move a staged job to ``partition`` on exactly ``nodes``
        (``placement_words``)."""
        await self.run("scontrol", *placement_words(job_id, partition, nodes, marker, time_limit))

    async def place_many(
        self, placements: Sequence[tuple[int, Sequence[str], str, int]], partition: str
    ) -> Result:
        """Many ``place`` updates in ONE ``scontrol`` process (commands on stdin; it runs them all,
        carrying on past a failed one). Returns the result unchecked: a nonzero status means at
        least one update failed, and the caller finds which by verifying."""
        lines = [
            " ".join(placement_words(job_id, partition, nodes, marker, time_limit))
            for job_id, nodes, marker, time_limit in placements
        ]
        return await self.run("scontrol", check=False, stdin=("\n".join(lines) + "\n").encode())

    async def submit(self, argv: Sequence[str]) -> int:
        """``sbatch --parsable ...`` -> the new job's id."""
        result = await self.run(*argv)
        head = result.stdout.strip().split(";", 1)[0]
        if not head.isdigit():
            raise SlurmError(
                argv, result.returncode, f"sbatch printed {result.stdout.strip()!r}, not a job id"
            )
        return int(head)

    async def unstage(self, job_id: int, staging: str) -> None:
        """Back to the staging partition with no node list (after an eviction or a bad placement)."""
        await self.run("scontrol", "update", f"JobId={job_id}", f"Partition={staging}", "NodeList=")

    async def set_admin_comment(self, job_id: int, text: str) -> None:
        """AdminComment of a job (root only); ``scontrol show job`` shows it to the job's user."""
        await self.run("scontrol", "update", f"JobId={job_id}", f"AdminComment={text}")

    async def requeuehold(self, job_id: int) -> None:
        await self.run("scontrol", "requeuehold", str(job_id))

    async def release(self, job_id: int) -> None:
        await self.run("scontrol", "release", str(job_id))

    async def cancel(self, job_id: int) -> None:
        await self.run("scancel", str(job_id))

    async def ping(self) -> bool:
        return (await self.run("scontrol", "ping", check=False)).returncode == 0
