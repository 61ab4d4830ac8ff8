"""The .proto files: generated code up to date, buf lint clean, every RPC implemented."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from provisioner.v1 import protogen
from provisioner.cluster.service import ClusterAdminServicer, ClusterServicer
from provisioner.front.admin import FRONT_ONLY_ADMIN_RPCS, FrontAdminServicer
from provisioner.front.service import SessionServicer
from provisioner.v1 import admin_service_pb2, admin_service_pb2_grpc
from provisioner.v1 import cluster_service_pb2, cluster_service_pb2_grpc
from provisioner.v1 import session_service_pb2, session_service_pb2_grpc

BUF_VERSION = "1.75.0"
COMMITTED = protogen.ROOT / "provisioner" / "v1"


def test_generated_code_matches_the_protos(tmp_path):
    fresh = {p.name: p for p in protogen.generate(tmp_path)}
    committed = {p.name: p for p in COMMITTED.glob("*_pb2*.py*")}
    hint = "generated code is stale: run `python -m provisioner.v1.protogen` and commit the result"
    assert sorted(committed) == sorted(fresh), hint
    stale = [name for name, path in fresh.items() if path.read_bytes() != committed[name].read_bytes()]
    assert not stale, f"{hint} (differs: {', '.join(sorted(stale))})"


def buf_command() -> list[str]:
    if buf := shutil.which("buf"):
        return [buf]
    if npx := shutil.which("npx"):
        return [npx, "--yes", f"@bufbuild/buf@{BUF_VERSION}"]
    pytest.skip("!!! BUF LINT NOT RUN: neither `buf` nor `npx` is on PATH; "
                "install buf or Node.js to lint the .proto files !!!")


def buf_lint(proto_dir: Path) -> subprocess.CompletedProcess:
    # Plain subprocess is fine here: no servers run in this module.
    try:
        return subprocess.run([*buf_command(), "lint"], cwd=proto_dir, capture_output=True, text=True,
                              timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("buf lint did not finish in 120 s")


def test_buf_lint_passes():
    result = buf_lint(protogen.PROTO_DIR)
    assert result.returncode == 0, f"buf lint failed:\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def test_buf_lint_catches_bad_names(tmp_path):
    # Proves the lint above checks something, so it cannot pass vacuously.
    copy = tmp_path / "protos"
    shutil.copytree(protogen.PROTO_DIR, copy)
    types = copy / "provisioner" / "v1" / "types.proto"
    types.write_text(types.read_text() + "\nmessage bad_name {\n  string BadField = 1;\n}\n")
    result = buf_lint(copy)
    assert result.returncode != 0, f"buf lint accepted a badly named message:\n{result.stdout}{result.stderr}"
    assert "bad_name" in result.stdout + result.stderr


@pytest.mark.parametrize("servicer, base, module, service", [
    (SessionServicer, session_service_pb2_grpc.SessionServiceServicer, session_service_pb2, "SessionService"),
    (FrontAdminServicer, admin_service_pb2_grpc.AdminServiceServicer, admin_service_pb2, "AdminService"),
    (ClusterServicer, cluster_service_pb2_grpc.ClusterServiceServicer, cluster_service_pb2, "ClusterService"),
    (ClusterAdminServicer, admin_service_pb2_grpc.AdminServiceServicer, admin_service_pb2, "AdminService"),
])
def test_every_rpc_is_implemented(servicer, base, module, service):
    assert issubclass(servicer, base)
    rpcs = [m.name for m in module.DESCRIPTOR.services_by_name[service].methods]
    assert rpcs
    # The generated base answers UNIMPLEMENTED; an inherited method means a missing RPC.
    if servicer is ClusterAdminServicer:
        rpcs = [name for name in rpcs if name not in FRONT_ONLY_ADMIN_RPCS]
    missing = [name for name in rpcs if getattr(servicer, name) is getattr(base, name)]
    assert not missing, f"{servicer.__name__} does not implement {service}: {', '.join(missing)}"
