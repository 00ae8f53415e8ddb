"""Regenerate the Python protobuf / gRPC modules from proto/ (``make gen``).

The generated modules live in ``muster/v1/`` and are committed; ``tests/test_generated.py``
regenerates them into a temporary directory and fails when the committed copy is stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

import grpc_tools
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = sorted(str(p.relative_to(ROOT / "proto")) for p in (ROOT / "proto").rglob("*.proto"))


def generate(out_dir: Path) -> None:
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    args = [
        "protoc",
        f"-I{ROOT / 'proto'}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *PROTOS,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    # Only the versioned packages (muster/v1) are generated; muster/ itself is the hand-written
    # shared package.
    for pkg in {out_dir / Path(p).parent for p in PROTOS}:
        (pkg / "__init__.py").touch()


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
