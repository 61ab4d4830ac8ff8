"""A grpc.aio server with what every one of ours carries: tracing, health, reflection, and a
graceful stop (stop accepting, let in-flight RPCs finish, then exit)."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass
from typing import Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from provisioner.observability import telemetry
from provisioner.api import limits
from provisioner.api.guard import Guard
from provisioner.api.wrapping import WrappingServer
from provisioner.common.port_holder import PortTaken
from provisioner.security.tls import check_plaintext

log = logging.getLogger(__name__)

# Clients (the front) ping idle connections every second to notice a hung peer; allow it.
# (Without this the server answers the third early ping with GOAWAY "too_many_pings", dropping
# every stream on the connection.)
ACCEPT_PINGS = [("grpc.http2.min_ping_interval_without_data_ms", 500),
                ("grpc.keepalive_permit_without_calls", 1)]
# gRPC sets SO_REUSEPORT by default, so a second process on the same port binds too and the kernel
# shares the connections between the two: half the calls reach the wrong fleet. Bind exclusively.
EXCLUSIVE_PORT = [("grpc.so_reuseport", 0)]


def bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None, what: str) -> int:
    """Adds the listening port; a port in use raises PortTaken naming the process that holds it."""
    try:
        port = (server.add_insecure_port(address) if credentials is None
                else server.add_secure_port(address, credentials))
    except RuntimeError:  # grpc's answer to a failed bind
        port = 0
    if port == 0:
        if address.rsplit(":", 1)[-1] not in ("", "0"):
            raise PortTaken(address, what)
        raise OSError(f"cannot listen on {address}")
    return port


@dataclass(frozen=True)
class ConnectionLimits:
    """What anyone who can reach the port may hold of the server. Idle TCP connections that never
    finish a TLS handshake were dropped only after gRPC's default 120 s, and with no cap 3,000
    of them took 3,000 file descriptors and about 140 MB; anonymous health watches cost memory
    each."""

    max_connections: int = 4096
    handshake_timeout_s: float = 10.0
    # A connection with no call for this long is closed (clients reconnect when they next call).
    idle_s: float = 600.0
    health_watches: int = 64  # open grpc.health.v1 Watch streams, which need no credential

    def options(self) -> list[tuple[str, int]]:
        return [("grpc.max_allowed_incoming_connections", self.max_connections),
                ("grpc.server_handshake_timeout_ms", int(self.handshake_timeout_s * 1000)),
                ("grpc.max_connection_idle_ms", int(self.idle_s * 1000))]


class CappedHealth(health.aio.HealthServicer):
    """The standard health service with a cap on open Watch streams: anyone may open them."""

    def __init__(self, max_watches: int):
        super().__init__()
        self.max_watches, self.watches = max_watches, 0

    async def Watch(self, request, context):
        if self.watches >= self.max_watches:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"at most {self.max_watches} health watches at a time; use Check")
        self.watches += 1
        try:
            await super().Watch(request, context)
        finally:
            self.watches -= 1


class Server:
    """`guard` authenticates and authorizes every call of ours (api/guard.py); `credentials` are
    TLS (security/tls.py). Without credentials the server listens in plaintext, which it refuses
    on a non-loopback address unless `plaintext_anywhere`."""

    def __init__(self, address: str, register: Callable[[grpc.aio.Server], Iterable[str]],
                 tracer_provider=None, on_drain: Callable[[], None] | None = None, *,
                 guard: Guard, credentials: grpc.ServerCredentials | None,
                 plaintext_anywhere: bool = False, health_port: HealthPort | None = None,
                 connections: ConnectionLimits = ConnectionLimits()):
        """`health_port`, if any, mirrors this server's serving status."""
        self.on_drain = on_drain
        self.health_port = health_port
        self.guard = guard
        self.server = grpc.aio.server(options=[*ACCEPT_PINGS, *EXCLUSIVE_PORT, *connections.options(),
                                               ("grpc.max_receive_message_length", limits.MAX_REQUEST_BYTES)])
        # Tracing outermost, so the guard's refusals and the caller's identity land on the span.
        wrappers = [*telemetry.server_wrappers(tracer_provider), guard.wrap]
        self.services = list(register(WrappingServer(self.server, wrappers)))
        self.health = CappedHealth(connections.health_watches)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [*self.services, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)
        if credentials is None:
            check_plaintext(address, plaintext_anywhere)
        self.port = bind(self.server, address, credentials, "the API")
        self.address = f"{address.rsplit(':', 1)[0]}:{self.port}"

    async def start(self) -> None:
        await self.server.start()
        await self._set_serving(health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float = 10.0, settle_s: float = 0.0) -> None:
        """Reports NOT_SERVING, ends open streams (watchers reconnect elsewhere or later), still
        serves for `settle_s` (calls already on their way are taken, not refused: a signal can be
        handled before the calls that arrived with it), then refuses new RPCs and gives in-flight
        unary ones `grace_s` to finish."""
        await self._set_serving(health_pb2.HealthCheckResponse.NOT_SERVING)
        if self.on_drain is not None:
            self.on_drain()
        if settle_s > 0:
            await asyncio.sleep(settle_s)  # wall time: calls in flight on the network, not model time
        await self.server.stop(grace_s)

    async def _set_serving(self, status) -> None:
        for name in ("", *self.services):
            await self.health.set(name, status)
            if self.health_port is not None:
                await self.health_port.health.set(name, status)


class HealthPort:
    """grpc.health.v1 alone, in plaintext on a port of its own, for probes that speak no TLS (the
    kubelet's native gRPC probes). It serves nothing but serving status, so it needs neither TLS
    nor credentials; every other service stays on the main server's TLS port.

    Service "" (and each of the main server's services) mirrors the main server: NOT_SERVING
    until it serves (a standby replica waiting for its lease), SERVING while it does,
    NOT_SERVING again from the moment it drains. Service "liveness" is SERVING while the process
    answers at all, standby or not. Start it before anything that may wait."""

    LIVENESS = "liveness"

    def __init__(self, address: str):
        self.server = grpc.aio.server(options=EXCLUSIVE_PORT)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = bind(self.server, address, None, "health")
        self.address = f"{address.rsplit(':', 1)[0]}:{self.port}"

    async def start(self) -> None:
        await self.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.health.set(self.LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        await self.server.start()

    async def stop(self, grace_s: float = 1.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)


def stop_event_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT, so the process can drain instead of dying mid-RPC."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop
