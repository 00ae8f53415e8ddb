"""sla: jobs that have waited past their service-level waiting time go first (Volcano ``plugins/sla``).

A job's waiting time comes from its annotation ``volcano.sh/sla-waiting-time`` (then the legacy
``sla-waiting-time``), else from the plugin argument ``sla-waiting-time``; values are Go durations
(``1h2m3s4ms5us6ns``); an invalid or non-positive value means "no SLA". Registers:

* job_order -- jobs with a waiting time before jobs without; between two such jobs, the earlier
  deadline (creation time + waiting time) first.
* job_enqueueable and job_pipelined -- a job whose waiting time is over votes *permit* (it is
  admitted / kept pipelined even if other plugins in later tiers would not permit); otherwise abstain.

Creation time is ``JobSpec.created_at``; a job without one counts as created when the session opened.
"""

from __future__ import annotations

import time

from server.plugins.base import Plugin
from server.session.extension_points import (
    ABSTAIN,
    JOB_ENQUEUEABLE,
    JOB_ORDER,
    JOB_ORDER_KEY,
    JOB_PIPELINED,
    PERMIT,
)
from server.session.info import JobInfo
from server.session.options import parse_go_duration
from server.session.session import Session

JOB_WAITING_TIME = "sla-waiting-time"
JOB_WAITING_TIME_ANNOTATION = "volcano.sh/sla-waiting-time"

# Wall clock (seconds since the epoch); tests replace it.
now = time.time


def positive_duration(value: object) -> float | None:
    """A waiting time: a positive Go duration string, else None (Volcano ignores the setting)."""
    if not isinstance(value, str):
        return None
    try:
        seconds = parse_go_duration(value)
    except ValueError:
        return None
    return seconds if seconds > 0 else None


def job_waiting_time(job: JobInfo) -> float | None:
    """Volcano JobInfo.WaitingTime: the new annotation key first, then the legacy one."""
    annotations = job.spec.annotations
    for key in (JOB_WAITING_TIME_ANNOTATION, JOB_WAITING_TIME):
        if key in annotations:
            wt = positive_duration(annotations[key])
            if wt is not None:
                return wt
    return None


class SlaPlugin(Plugin):
    name = "sla"
    reads_clock = True  # a job's waiting time runs out while nothing else changes
    ARGUMENTS = {JOB_WAITING_TIME: None}

    def on_session_open(self, ssn: Session) -> None:
        session_now = now()
        global_wait = positive_duration(self.arguments.get(JOB_WAITING_TIME))

        def waiting_time(job: JobInfo) -> float | None:
            wt = job_waiting_time(job)
            return wt if wt is not None else global_wait

        def created(job: JobInfo) -> float:
            c = job.spec.created_at
            return session_now if c is None else c

        def job_order(left: JobInfo, right: JobInfo) -> int:
            lw, rw = waiting_time(left), waiting_time(right)
            if lw is None:
                return 0 if rw is None else 1
            if rw is None:
                return -1
            ld, rd = created(left) + lw, created(right) + rw
            return -1 if ld < rd else (1 if ld > rd else 0)

        def permit_when_overdue(job: JobInfo) -> int:
            wt = waiting_time(job)
            if wt is None or session_now - created(job) < wt:
                return ABSTAIN
            return PERMIT

        def job_order_key(job: JobInfo) -> tuple[int, float]:
            wt = waiting_time(job)
            return (
                (1, 0.0) if wt is None else (0, created(job) + wt)
            )  # jobs without a deadline last

        ssn.register(JOB_ORDER, self.name, job_order)
        ssn.register(JOB_ORDER_KEY, self.name, job_order_key)
        ssn.register(JOB_ENQUEUEABLE, self.name, permit_when_overdue)
        ssn.register(JOB_PIPELINED, self.name, permit_when_overdue)
