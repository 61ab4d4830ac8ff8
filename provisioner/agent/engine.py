"""The container runtime over the Docker Engine API (docker on the VM image; podman serves the same
API), through the `docker` package's low-level client. Its calls block, so each runs in a thread;
its exceptions end here, as ContainerError with the engine's reason."""

from __future__ import annotations

import asyncio
import math
from typing import Any, Callable

from provisioner.agent.runtime import (SESSION_LABEL, ByteCallback, ContainerError, Credentials, ImageRef,
                                       NotebookSpec, Placement, PullBytes, Running, SessionContainer,
                                       container_name, create_body)

API_VERSION = "1.41"  # docker 20.10 and later; podman 4's compatible API
LOG_TAIL = 5  # lines of a failed container's output in its failure


class DockerEngine:
    def __init__(self, url: str = "unix:///var/run/docker.sock", timeout_s: float = 120.0):
        self.url, self.timeout_s = url, timeout_s
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            import docker

            self._client = docker.APIClient(base_url=self.url, version=API_VERSION, timeout=int(self.timeout_s))
        return self._client

    async def _call(self, fn: Callable[[], Any]) -> Any:
        import docker.errors
        import requests.exceptions

        try:
            return await asyncio.to_thread(fn)
        except docker.errors.APIError as err:
            raise ContainerError(str(err.explanation or err)) from None
        except (requests.exceptions.RequestException, OSError) as err:
            raise ContainerError(f"the engine at {self.url} did not answer: {err}") from None

    async def pull(self, image: ImageRef, credentials: Credentials | None, on_bytes: ByteCallback) -> None:
        loop, counted = asyncio.get_running_loop(), PullBytes(dict(image.layers))
        auth = {"username": credentials.username, "password": credentials.password} if credentials else None

        def run() -> None:
            for message in self.client.pull(image.pinned, stream=True, decode=True, auth_config=auth):
                done = counted.feed(message)
                loop.call_soon_threadsafe(on_bytes, done)

        await self._call(run)
        # The stream may end without an error and without the image (a dropped connection).
        await self._call(lambda: self.client.inspect_image(image.pinned))

    async def _inspect(self, name: str) -> dict | None:
        import docker.errors

        def run() -> dict | None:
            try:
                return self.client.inspect_container(name)
            except docker.errors.NotFound:
                return None

        return await self._call(run)

    async def start(self, spec: NotebookSpec, placement: Placement) -> Running:
        name = container_name(spec.session_id)
        info = await self._inspect(name)
        if info is None:
            await self._call(lambda: self.client.create_container_from_config(create_body(spec, placement), name))
            info = await self._inspect(name)
        if info is not None and info["State"].get("Status") == "created":
            await self._call(lambda: self.client.start(name))
            info = await self._inspect(name)
        if info is None:
            raise ContainerError(f"container {name} vanished as it started")
        if not info["State"].get("Running"):
            raise ContainerError(await self._why_ended(info))
        return Running(info["Id"], _host_port(info, placement.port))

    async def _why_ended(self, info: dict) -> str:
        state = info["State"]
        logs = await self._call(lambda: self.client.logs(info["Id"], tail=LOG_TAIL))
        text = " | ".join(line for line in logs.decode(errors="replace").splitlines() if line.strip())
        why = f"container exited {state.get('ExitCode')}"
        if state.get("OOMKilled"):
            why += " (out of memory)"
        if state.get("Error"):
            why += f": {state['Error']}"
        return f"{why}: {text}" if text else why

    async def exited(self, container_id: str) -> str | None:
        info = await self._inspect(container_id)
        if info is None:
            return "the container is gone"
        return None if info["State"].get("Running") else await self._why_ended(info)

    async def stop(self, container_id: str, grace_s: float) -> None:
        import docker.errors

        def run() -> None:
            try:
                # The engine sends the image's stop signal (SIGTERM), waits, then SIGKILLs.
                self.client.stop(container_id, timeout=math.ceil(grace_s))
                self.client.remove_container(container_id, v=True, force=True)
            except docker.errors.NotFound:
                pass

        await self._call(run)

    async def session_containers(self) -> list[SessionContainer]:
        found = await self._call(lambda: self.client.containers(all=True, filters={"label": SESSION_LABEL}))
        out = []
        for c in found:
            info = await self._inspect(c["Id"])
            pid = int(info["State"].get("Pid") or 0) if info else 0
            out.append(SessionContainer(c["Id"], c["Labels"].get(SESSION_LABEL, ""), pid))
        return out

    async def close(self) -> None:
        if self._client is not None:
            self._client.close()


def _host_port(info: dict, port: int) -> int:
    bound = (info.get("NetworkSettings", {}).get("Ports") or {}).get(f"{port}/tcp") or []
    if not bound:
        raise ContainerError(f"port {port} of the container is not published")
    return int(bound[0]["HostPort"])
