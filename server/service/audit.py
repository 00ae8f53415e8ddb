"""The audit log: one line per call that changes state, per refusal, per change of leader.

Lines go to the ``muster.service`` logger as event ``audit`` (docs/security.md), so an operator
filters one event for everything that was done, refused or taken over.
"""

from __future__ import annotations

import structlog

log = structlog.get_logger("muster.service")

# An audit line names at most this much of a refusal's reason: a reason quotes the request, and a
# small request can expand into a huge one.
AUDIT_REASON_CHARS = 512


def audit(who: str, rpc: str, result: str, reason: str = "") -> None:
    """One audit line: who made which call, and how it ended (the reason, bounded, when refused)."""
    if reason:
        if len(reason) > AUDIT_REASON_CHARS:
            reason = f"{reason[:AUDIT_REASON_CHARS]}... ({len(reason):,} characters)"
        log.info("audit", who=who, rpc=rpc, result=result, reason=reason)
    else:
        log.info("audit", who=who, rpc=rpc, result=result)
