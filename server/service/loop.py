"""The cycle loop and the scheduler configuration it runs with.

One cycle at a time: periodic (``period`` seconds) and woken early by submissions and cluster
changes. Wake-ups are coalesced: any number of ``wake()`` calls while a cycle runs (or while the
loop waits) cause one more cycle, not one each. The CPU work (materializing the snapshot and
``SchedulerCore.run_cycle``) runs in a worker process (or thread, see ``core_runner``) so the API
stays responsive.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio
import structlog

from server.config import DEFAULT_CONFIG_YAML, ConfigError, SchedulerConfig, load_config
from server.model import PriorityClass
from server.scheduler import SchedulerCore
from server.service import ingest
from server.service.apply import apply_result
from server.service.core_runner import CoreRunner, CycleWorker
from server.service.errors import DomainError, invalid
from server.service.observability import Telemetry
from server.service.observability.cycletrace import CycleObservation
from server.service.observability.history import CycleHistory
from server.service.retention import commit_and_drop_finished
from server.service.snapshot import Capture, capture, prepare_capture
from server.service.state import ClusterState
from server.service.store import StateFileLost, StoreWriter
from server.service.timelimits import enforce_time_limits

log = structlog.get_logger("muster.loop")


class ConfigManager:
    """The active scheduler config: built-in, a file (hot reloaded on mtime change) or UpdateConfig.

    A new config is validated when it arrives and swapped in at the start of the next cycle.
    """

    def __init__(
        self, path: str | None = None, stored_yaml: str | None = None, generation: int = 0
    ) -> None:
        self.path = Path(path) if path else None
        self._mtime: float | None = None
        self.generation = generation
        if self.path is not None:
            text = self.path.read_text()
            self._mtime = self.path.stat().st_mtime
            self.config = load_config(text)  # a bad file at startup is fatal (ConfigError)
            self.generation += 1
        elif stored_yaml:
            self.config = load_config(stored_yaml)
        else:
            self.config = load_config(DEFAULT_CONFIG_YAML)
        self.yaml = self.config.yaml_text or DEFAULT_CONFIG_YAML
        self.pending: SchedulerConfig | None = self.config

    def update(self, text: str) -> SchedulerConfig:
        """UpdateConfig: ConfigError -> INVALID_ARGUMENT; nothing changes on error."""
        return self.apply(self.parse(text), text)

    @staticmethod
    def parse(text: str) -> SchedulerConfig:
        """Validate an UpdateConfig text (no state read: callers may run it in a worker thread,
        as pure-Python YAML parsing of a large text takes seconds)."""
        if not text.strip():
            raise invalid("yaml: must not be empty")
        try:
            return load_config(text)
        except ConfigError as exc:
            raise invalid(f"yaml: {exc}") from None

    def apply(self, config: SchedulerConfig, text: str) -> SchedulerConfig:
        self._set(config, text)
        return config

    def _set(self, config: SchedulerConfig, text: str) -> None:
        self.config = config
        self.yaml = text
        self.generation += 1
        self.pending = config

    def poll_file(self) -> bool:
        """Re-read ``--config FILE`` if its mtime changed. Whatever goes wrong (the file gone or
        unreadable, not text, not a valid configuration, or a bug in the parser) is logged as
        ``config.reload_failed`` and the configuration in use stays: a reload never stops the server.
        The file is read again when its mtime changes again."""
        if self.path is None:
            return False
        try:
            mtime = self.path.stat().st_mtime
            if mtime == self._mtime:
                return False
            self._mtime = mtime
            text = self.path.read_text()
            config = load_config(text)
        except Exception as exc:  # noqa: BLE001 - anything: see above
            reason = (
                str(exc)
                if isinstance(exc, OSError | ConfigError)
                else f"{type(exc).__name__}: {exc}"
            )
            log.error(
                "config.reload_failed",
                path=str(self.path),
                error=reason[:2000],
                generation=self.generation,
            )
            return False
        self._set(config, text)
        log.info("config.reloaded", path=str(self.path), generation=self.generation)
        return True

    def follow(self, meta: dict[str, str]) -> None:
        """A replica follows the configuration its leader stored (UpdateConfig); a ``--config``
        file, read by every replica, stays in charge when given."""
        text = meta.get("config_yaml")
        generation = int(meta.get("config_generation", self.generation))
        if self.path is not None or not text or generation <= self.generation and text == self.yaml:
            return
        try:
            config = load_config(text)
        except ConfigError as exc:  # the leader validated it; a newer format would land here
            log.error("config.follow_failed", error=str(exc)[:2000])
            return
        self.config, self.yaml, self.generation, self.pending = config, text, generation, config

    def take_pending(self) -> SchedulerConfig | None:
        config, self.pending = self.pending, None
        return config


def priority_classes_of(config: SchedulerConfig) -> Iterable[PriorityClass]:
    """The config's priority classes, whatever container the loader uses (absent: none)."""
    classes: Any = getattr(config, "priority_classes", None) or {}
    items = classes.values() if isinstance(classes, dict) else classes
    return [c for c in items if isinstance(c, PriorityClass)]


class CycleLoop:
    def __init__(
        self,
        state: ClusterState,
        writer: StoreWriter,
        configs: ConfigManager,
        *,
        period: float = 1.0,
        expire_interval: float = 1.0,
        worker: CycleWorker = "process",
        min_interval: float = 0.0,
    ) -> None:
        self.state = state
        self.writer = writer
        self.configs = configs
        self.core = SchedulerCore(configs.config)
        self.config = configs.config  # the one the core has: the capture's queue window follows it
        self.runner = CoreRunner(worker)
        self.period = period
        # At least this long from one cycle's start to the next: a burst of submissions and deltas
        # wakes the loop many times but makes one cycle.
        self.min_interval = min_interval
        self._last_start = float("-inf")
        self.expire_interval = expire_interval
        self.cycles = 0
        self.failures = 0
        self.last_cycle_seconds = 0.0
        self._wake = anyio.Event()
        self._cycle_done = anyio.Event()
        self._running = False
        self.telemetry = Telemetry.disabled()  # the server sets its own (traces, metrics)
        self.history: CycleHistory | None = None  # recent cycles, kept when the dashboard is on

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Cycles until cancelled. A worker process that cannot start ends it (``CoreWorkerError``
        saying so: the server cannot schedule); so does a state file deleted under the server,
        quietly (``StateFileLost``, logged by the store): a cycle must not issue decisions that
        cannot be saved, while the API stays up to say why."""
        try:
            await self.runner.start()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._expiry_loop)
                while True:
                    with anyio.move_on_after(self.period):
                        await self._wake.wait()
                    rest = self._last_start + self.min_interval - time.monotonic()
                    if rest > 0:  # wakes meanwhile coalesce into this cycle
                        await anyio.sleep(rest)
                    self._wake = anyio.Event()  # wakes from here on ask for another cycle
                    self._last_start = time.monotonic()
                    await self.run_once()
        except* StateFileLost:
            log.error(
                "cycle.stopped", reason="the state file is gone: no more cycles until a restart"
            )
        except* DomainError as failed:  # a replica's write refused (lease lost), store out of reach
            log.warning("cycle.stopped", reason=str(failed.exceptions[0]))
        finally:
            await self.runner.aclose()  # the core's worker process goes with the loop

    async def _expiry_loop(self) -> None:
        while True:
            await anyio.sleep(self.expire_interval)
            self.configs.poll_file()
            ingest.expire(self.state)
            # Silent backends: their nodes NotReady and tasks Unknown, then those tasks lost.
            ingest.check_liveness(self.state)
            # Tasks running past their time limit (and its grace): their backend did not end them.
            enforce_time_limits(self.state)
            # Also where finished jobs past the retention leave memory: under the writer's lock,
            # once everything before is written (server.service.retention).
            await self.writer.flush(functools.partial(commit_and_drop_finished, self.state))

    async def run_once(self) -> None:
        """One cycle: capture, schedule in a worker, apply, persist."""
        config = self.configs.take_pending()
        if config is not None:
            self.core.update_config(config)
            self.config = config
            self.state.set_priority_classes(priority_classes_of(config))
        started = time.perf_counter()
        self._running = True
        await prepare_capture(self.state, self.config)
        captured = capture(self.state, self.config)
        with self.telemetry.cycle(captured) as obs:  # trace + metrics; cycle_id on every log line
            await self._cycle(captured, obs, started)

    async def _cycle(self, captured: Capture, obs: CycleObservation, started: float) -> None:
        try:
            result = await self.runner.run(self.core, captured, prepared=obs.snapshot_done)
            obs.core_done()
        except (
            Exception
        ) as exc:  # a broken cycle must not take the server down; the next one retries
            obs.fail(exc)
            self.failures += 1
            log.exception("cycle.failed", cycle=captured.cycle_id)
            await self._flush()
            self._finish_cycle()
            return
        for job_id, why in result.quarantined.items():  # the cycle ran without them
            log.error(
                "job.quarantined",
                cycle=captured.cycle_id,
                job=job_id,
                reason="CycleFailed",
                error=why,
            )
        with obs.applying():  # decisions issued here carry the cycle's trace context
            stats = await apply_result(self.state, captured, result, after_part=self._flush)
        await self._flush()
        obs.finish(
            result,
            binds=stats.binds,
            evictions=stats.evictions,
            dropped=stats.dropped_binds + stats.dropped_evictions,
        )
        self.last_cycle_seconds = time.perf_counter() - started
        if self.history is not None:
            self.history.record(
                self.state, result, self.last_cycle_seconds, stats.binds, stats.evictions
            )
        event = (
            "cycle.done" if stats.binds or stats.evictions or stats.dropped_binds else "cycle.idle"
        )
        logger = log.info if event == "cycle.done" else log.debug
        logger(
            event,
            cycle=captured.cycle_id,
            jobs=len(captured.jobs),
            nodes=len(captured.nodes),
            binds=stats.binds,
            evictions=stats.evictions,
            dropped=stats.dropped_binds + stats.dropped_evictions,
            seconds=round(self.last_cycle_seconds, 4),
        )
        self._finish_cycle()

    async def _flush(self) -> None:
        """Write what changed (rows) and publish its watch events."""
        await self.writer.flush(self.state.commit)

    def _finish_cycle(self) -> None:
        self._running = False
        self.cycles += 1
        self._cycle_done.set()
        self._cycle_done = anyio.Event()

    async def next_cycle(self) -> None:
        """Wake the loop and wait for a cycle that captured its snapshot after this call."""
        count = 2 if self._running else 1
        self.wake()
        await self.wait_cycles(count)

    async def wait_cycles(self, count: int) -> None:
        """Wait until at least ``count`` more cycles have finished (tests, tools)."""
        target = self.cycles + count
        while self.cycles < target:
            await self._cycle_done.wait()
