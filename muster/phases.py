"""Job phases grouped by where the job stands: the one set of each for the server and the
clients."""

from __future__ import annotations

from muster.v1 import muster_pb2 as pb

# Not started yet: waiting to be admitted (Pending) or placed (Inqueue). What job control holds
# and releases, and what a start estimate is for.
WAITING_PHASES = frozenset({pb.JOB_PHASE_PENDING, pb.JOB_PHASE_INQUEUE})
# Ended: it no longer takes part in scheduling, and ListJobHistory lists it.
TERMINAL_PHASES = frozenset({pb.JOB_PHASE_COMPLETED, pb.JOB_PHASE_FAILED, pb.JOB_PHASE_CANCELLED})
