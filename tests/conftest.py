"""The scheduling core never changes the snapshot it is given: every cycle run in the tests checks it."""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Iterator

import pytest
import structlog
from pgserver import PostgresNotFound, PostgresServer

from server.model import ClusterSnapshot, CycleResult
from server.scheduler import SchedulerCore


@pytest.fixture(autouse=True)
def snapshot_left_unchanged(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    run_cycle = SchedulerCore.run_cycle

    def checked(self: SchedulerCore, snapshot: ClusterSnapshot, cycle_id: int) -> CycleResult:
        before = copy.deepcopy(snapshot)
        result = run_cycle(self, snapshot, cycle_id)
        assert snapshot == before, "the scheduling core changed its snapshot"
        return result

    monkeypatch.setattr(SchedulerCore, "run_cycle", checked)
    return


@pytest.fixture(autouse=True)
def structlog_config_restored() -> Iterator[None]:
    """A test that runs the CLI in-process (``clients.cli.main``) configures structlog for the CLI
    (warnings only): without this, later tests' ``capture_logs`` would miss info lines (audit)."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


# -- a throwaway PostgreSQL for the store tests ----------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One cluster for the session (no fsync); tests take a database each (``pg_dsn``)."""
    try:
        server = PostgresServer(fast=True)
    except PostgresNotFound as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs PostgreSQL for the store tests: {exc}")
        pytest.skip(f"{exc} (apt-get install postgresql to run the PostgreSQL store tests)")
    with server:
        yield server


_databases = itertools.count(1)


@pytest.fixture
def pg_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """The DSN of a fresh, empty database for this test (dropped afterwards)."""
    name = f"test_{os.getpid()}_{next(_databases)}"
    dsn = postgres_server.new_database(name)
    try:
        yield dsn
    finally:
        postgres_server.drop_database(name)
