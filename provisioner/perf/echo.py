"""The ceiling of the stack: a raw two-hop grpc.aio echo with the fleet's transport (TLS to the
first hop, mutual TLS between the hops, the fleet's local certificates), no application code.

    python -m provisioner.perf.echo backend ADDRESS DATA_DIR
    python -m provisioner.perf.echo forward ADDRESS BACKEND_ADDRESS DATA_DIR

Each prints `listening` once it serves. Messages are raw bytes, returned as they came.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc

from provisioner.security import tls
from provisioner.security.pki import local_files

METHOD = "/provisioner.perf.Echo/Echo"
PAYLOAD_BYTES = 200
# The certificates the fleet's own hops use: the front's faces clients and dials the cluster's.
FORWARD_CERT, BACKEND_CERT = "front", "cluster-us-central1"


def _handler(behavior) -> grpc.GenericRpcHandler:
    # No (de)serializers: the bytes go through untouched.
    return grpc.method_handlers_generic_handler(
        "provisioner.perf.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(behavior)})


async def _serve(address: str, handler: grpc.GenericRpcHandler, credentials: grpc.ServerCredentials) -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_secure_port(address, credentials)
    await server.start()
    print("listening", flush=True)
    await server.wait_for_termination()


async def backend(address: str, data_dir: Path) -> None:
    async def echo(request: bytes, context) -> bytes:
        return request

    files = local_files(data_dir / "tls", BACKEND_CERT)
    await _serve(address, _handler(echo), tls.server_credentials(files, require_client_cert=True))


async def forward(address: str, backend_address: str, data_dir: Path, backend_name: str) -> None:
    files = local_files(data_dir / "tls", FORWARD_CERT)
    channel = grpc.aio.secure_channel(backend_address, tls.channel_credentials(*files.read()),
                                      options=[("grpc.ssl_target_name_override", backend_name)])
    call = channel.unary_unary(METHOD)

    async def relay(request: bytes, context) -> bytes:
        return await call(request, timeout=10)

    await _serve(address, _handler(relay), tls.server_credentials(files, require_client_cert=False))


def main(argv: list[str]) -> int:
    if argv[:1] == ["backend"] and len(argv) == 3:
        asyncio.run(backend(argv[1], Path(argv[2])))
    elif argv[:1] == ["forward"] and len(argv) == 5:
        asyncio.run(forward(argv[1], argv[2], Path(argv[3]), argv[4]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
