"""The node's container runtime: pulls image layers into its store and stops a session's containers.

Each image layer is published as its own artifact, `<layer_repository>:<layer id>`, so a VM pulls
exactly the layers it lacks, one at a time, with progress per layer; the runtime's content store
shares them between image versions (an image's own pull then fetches only its manifest). Both
runtimes are driven through their command-line tools: containerd (`ctr`, the `k8s.io` namespace
that GKE nodes use) and docker as the fallback.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from typing import Callable, Protocol

ByteCallback = Callable[[int], None]


class ContainerError(Exception):
    """A runtime command failed."""


class Containers(Protocol):
    async def has_layer(self, layer_id: str) -> bool: ...

    async def pull_layer(self, layer_id: str, size_bytes: int, on_bytes: ByteCallback) -> None:
        """Pulls one layer; `on_bytes` gets this layer's bytes done so far."""
        ...

    async def session_containers(self) -> list[str]:
        """Ids of the containers a session started (labelled with the session label)."""
        ...

    async def stop(self, container_id: str) -> None:
        """Stops and removes the container."""
        ...


async def _run(*argv: str) -> str:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise ContainerError(f"{' '.join(argv[:3])}: exit {proc.returncode}: {err.decode(errors='replace')[-300:]}")
    return out.decode(errors="replace")


class _CliRuntime:
    """Shared by both runtimes: pull progress is the layer's size once its pull ends (the CLIs'
    own progress bars are for terminals), which per layer is fine-grained enough."""

    def __init__(self, repository: str, label: str):
        self.repository, self.label = repository, label

    def ref(self, layer_id: str) -> str:
        return f"{self.repository}:{layer_id}"

    async def pull_layer(self, layer_id: str, size_bytes: int, on_bytes: ByteCallback) -> None:
        await _run(*self._pull_argv(self.ref(layer_id)))
        on_bytes(size_bytes)


class Containerd(_CliRuntime):
    NS = ("ctr", "--namespace", "k8s.io")

    def _pull_argv(self, ref: str) -> tuple[str, ...]:
        return (*self.NS, "images", "pull", ref)

    async def has_layer(self, layer_id: str) -> bool:
        return self.ref(layer_id) in (await _run(*self.NS, "images", "ls", "--quiet")).split()

    async def session_containers(self) -> list[str]:
        out = await _run(*self.NS, "containers", "ls", "--quiet", f"labels.\"{self.label}\"")
        return out.split()

    async def stop(self, container_id: str) -> None:
        try:
            await _run(*self.NS, "tasks", "kill", "--signal", "SIGKILL", container_id)
        except ContainerError:
            pass  # no running task
        await _run(*self.NS, "containers", "delete", container_id)


class Docker(_CliRuntime):
    def _pull_argv(self, ref: str) -> tuple[str, ...]:
        return ("docker", "pull", "--quiet", ref)

    async def has_layer(self, layer_id: str) -> bool:
        out = await _run("docker", "images", "--format", "{{json .}}", self.ref(layer_id))
        return any(json.loads(line) for line in out.splitlines() if line.strip())

    async def session_containers(self) -> list[str]:
        return (await _run("docker", "ps", "--all", "--quiet", "--filter", f"label={self.label}")).split()

    async def stop(self, container_id: str) -> None:
        await _run("docker", "rm", "--force", container_id)


def detect(kind: str, repository: str, label: str) -> Containers:
    """containerd when asked or found (`ctr` on the PATH), else docker."""
    if kind == "containerd" or (kind == "auto" and shutil.which("ctr")):
        return Containerd(repository, label)
    return Docker(repository, label)
