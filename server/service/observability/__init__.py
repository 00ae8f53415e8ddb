"""Observability of a Muster server: OpenTelemetry traces, Prometheus metrics, structured logs.

See docs/observability.md. ``Telemetry`` (``server.service.observability.telemetry``) is what the server
wires in; the scheduling core stays free of OpenTelemetry (it records timings in CycleResult).
"""

from server.service.observability.telemetry import SubmissionIndex, Telemetry

__all__ = ["SubmissionIndex", "Telemetry"]
