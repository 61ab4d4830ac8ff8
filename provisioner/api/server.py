"""A grpc.aio server with what every one of ours carries: tracing, health, reflection, and a
graceful stop (stop accepting, let in-flight RPCs finish, then exit)."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from provisioner import telemetry
from provisioner.api import limits
from provisioner.api.guard import Guard
from provisioner.api.wrapping import WrappingServer
from provisioner.security.tls import check_plaintext

log = logging.getLogger(__name__)

# Clients (the front) ping idle connections every second to notice a hung peer; allow it.
# (Without this the server answers the third early ping with GOAWAY "too_many_pings", dropping
# every stream on the connection.)
ACCEPT_PINGS = [("grpc.http2.min_ping_interval_without_data_ms", 500),
                ("grpc.keepalive_permit_without_calls", 1)]


class Server:
    """`guard` authenticates and authorizes every call of ours (api/guard.py); `credentials` are
    TLS (security/tls.py). Without credentials the server listens in plaintext, which it refuses
    on a non-loopback address unless `plaintext_anywhere`."""

    def __init__(self, address: str, register: Callable[[grpc.aio.Server], Iterable[str]],
                 tracer_provider=None, on_drain: Callable[[], None] | None = None, *,
                 guard: Guard, credentials: grpc.ServerCredentials | None,
                 plaintext_anywhere: bool = False, health_port: HealthPort | None = None):
        """`health_port`, if any, mirrors this server's serving status."""
        self.on_drain = on_drain
        self.health_port = health_port
        self.guard = guard
        self.server = grpc.aio.server(options=[*ACCEPT_PINGS, ("grpc.max_receive_message_length",
                                                               limits.MAX_REQUEST_BYTES)])
        # Tracing outermost, so the guard's refusals and the caller's identity land on the span.
        wrappers = [*telemetry.server_wrappers(tracer_provider), guard.wrap]
        self.services = list(register(WrappingServer(self.server, wrappers)))
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [*self.services, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)
        if credentials is None:
            check_plaintext(address, plaintext_anywhere)
            self.port = self.server.add_insecure_port(address)
        else:
            self.port = self.server.add_secure_port(address, credentials)
        if self.port == 0:
            raise OSError(f"cannot listen on {address}")
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
            await asyncio.sleep(settle_s)
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
        self.server = grpc.aio.server()
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"cannot listen on {address}")
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
