"""overcommit: admit jobs while the cluster, inflated by a factor, has room for their
minResources (Volcano ``plugins/overcommit``).

Argument ``overcommit-factor`` (default 1.2, values below 1 fall back to the default). Registers
job_enqueueable (inqueue + minResources <= total * factor - used, on the dimensions the job asks
for) and job_enqueued (the admitted job's minResources count as inqueue). At session open,
inqueue holds every Inqueue job's minResources, and the uncovered part of the minResources of
Running jobs that hold at least minMember allocated tasks.
"""

from __future__ import annotations

import numpy as np

from muster.quantity import MIN_RESOURCE
from server.model import ALLOCATED, PodGroupPhase
from server.plugins.base import Plugin
from server.session.extension_points import JOB_ENQUEUEABLE, JOB_ENQUEUED, PERMIT, refuse
from server.session.info import JobInfo
from server.session.session import Session

DEFAULT_FACTOR = 1.2


class OvercommitPlugin(Plugin):
    name = "overcommit"
    ARGUMENTS = {"overcommit-factor": DEFAULT_FACTOR}

    def on_session_open(self, ssn: Session) -> None:
        factor = self.arg_float("overcommit-factor", DEFAULT_FACTOR)
        if factor < 1.0:
            factor = DEFAULT_FACTOR
        used = ssn.nodes.used.sum(axis=0) if len(ssn.nodes) else ssn.space.zeros()
        idle = np.maximum(ssn.total_resource * factor - used, 0.0)
        # Volcano counts an Inqueue job's whole minResources (unlike proportion, which deducts
        # what is already allocated), and a Running job's minResources not yet covered by its
        # allocations once it holds minMember tasks.
        inqueue = ssn.space.zeros()
        for job in ssn.jobs.values():
            if job.min_resources is None:
                continue
            if job.phase == PodGroupPhase.INQUEUE:
                inqueue += job.min_resources
            elif job.phase == PodGroupPhase.RUNNING and job.count(*ALLOCATED) >= job.min_available:
                inqueue += np.maximum(job.min_resources - job.allocated, 0.0)
        for past in ssn.window.beyond.values():  # Inqueue jobs past the session's window
            inqueue += ssn.space.vec(past.inqueue)

        def enqueueable(job: JobInfo) -> int:
            if job.min_resources is None:
                return PERMIT
            need = inqueue + job.min_resources
            dims = job.min_resources > MIN_RESOURCE
            if np.all(need[dims] <= idle[dims] + MIN_RESOURCE):
                return PERMIT
            short = [ssn.space.dims[i] for i in np.nonzero(dims & (need > idle + MIN_RESOURCE))[0]]
            return refuse(
                self.name, f"resource in cluster is overused: insufficient {', '.join(short)}"
            )

        def enqueued(job: JobInfo) -> None:
            nonlocal inqueue
            if job.min_resources is not None:
                inqueue = inqueue + job.min_resources

        ssn.register(JOB_ENQUEUEABLE, self.name, enqueueable)
        ssn.register(JOB_ENQUEUED, self.name, enqueued)
