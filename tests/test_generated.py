"""The committed protobuf / gRPC modules must match proto/ (regenerate with `make gen`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _body(path: Path) -> list[str]:
    # The protobuf runtime version line depends on the local grpcio-tools; everything else must match.
    return [
        line
        for line in path.read_text().splitlines()
        if not line.startswith("# Protobuf Python Version")
    ]


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_proto"] = module
    spec.loader.exec_module(module)
    module.generate(tmp_path)
    generated = sorted(
        p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*") if p.suffix in (".py", ".pyi")
    )
    assert generated, "protoc produced nothing"
    for rel in generated:
        committed = ROOT / rel
        assert committed.exists(), f"{rel} is not committed: run `make gen`"
        assert _body(committed) == _body(tmp_path / rel), f"{rel} is stale: run `make gen`"
