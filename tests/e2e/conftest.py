"""The end-to-end tests' cluster: a real server and agents under the test's tmp_path."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from muster_e2e import Cluster


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        await c.stop_all()
        print(c.logs())  # shown by pytest only when the test failed
