"""Regenerates the Python code for protos/ into provisioner/v1/.

    python -m provisioner.v1.protogen

The generated modules are committed so that installing the package needs no build step;
tests/test_protos.py fails when they no longer match the .proto files.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "protos"


def proto_files() -> list[Path]:
    return sorted((PROTO_DIR / "provisioner" / "v1").glob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Writes *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every proto under out_dir."""
    from grpc_tools import protoc

    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p.relative_to(PROTO_DIR)) for p in proto_files()],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    return sorted((out_dir / "provisioner" / "v1").glob("*_pb2*.py*"))


def main() -> None:
    written = generate(ROOT)
    for path in written:
        print(path.relative_to(ROOT))
    sys.exit(0)


if __name__ == "__main__":
    main()
