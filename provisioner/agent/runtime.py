"""The node's container runtime, as the agent sees it: pull a pinned image, run a session's
notebook container, stop it, and list what sessions left behind.

The one real implementation (`engine.py`) speaks the Docker Engine API: docker on the VM image,
podman in tests (it serves the same API). `fakes.FakeRuntime` stands in for it elsewhere. The
request bodies are built here, as pure functions, so what the engine is asked is tested without
an engine (a GPU request, on machines without GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

ByteCallback = Callable[[int], None]

# Labels on every container the agent starts for a session: the wipe finds them by the first.
SESSION_LABEL = "provisioner.session"
USER_LABEL = "provisioner.user"
CLUSTER_LABEL = "provisioner.cluster"


class ContainerError(Exception):
    """The runtime refused or failed; the message is the runtime's reason."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """Registry login: `oauth2accesstoken` and an access token for Artifact Registry."""

    username: str
    password: str


@dataclass(frozen=True, slots=True)
class ImageRef:
    """An image pinned by its manifest digest; `layers` (digest, bytes) are what the cluster
    expects it to hold (the fake pulls those; the engine reads them from the manifest)."""

    repository: str
    digest: str
    layers: tuple[tuple[str, int], ...] = ()

    @property
    def pinned(self) -> str:
        return f"{self.repository}@{self.digest}"


@dataclass(frozen=True, slots=True)
class NotebookSpec:
    """A session's notebook container. `gpus`: how many of the VM's GPUs (0: no device request),
    or `gpu_ids` to name them."""

    session_id: str
    user: str
    cluster: str
    image: ImageRef
    secret: str
    cpus: float = 0.0  # 0: no limit
    memory_bytes: int = 0  # 0: no limit
    gpus: int = 0
    gpu_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the agent puts a notebook container on this host."""

    workspace: str  # the host directory mounted as the session's workspace
    workspace_mount: str = "/home/jovyan/work"
    port: int = 8888  # the notebook server's port in the container
    host_ip: str = "0.0.0.0"
    host_port: int = 8888  # 0: the engine picks a free port (tests, several sessions on one host)
    secret_env: str = "NOTEBOOK_TOKEN"  # the notebook server demands this secret


@dataclass(frozen=True, slots=True)
class Running:
    """A started notebook container and the host port its server is published on."""

    container_id: str
    host_port: int


@dataclass(frozen=True, slots=True)
class SessionContainer:
    id: str
    session_id: str
    pid: int = 0  # the host pid of its first process (0 once it ended); the rest share its pid namespace


class Runtime(Protocol):
    async def pull(self, image: ImageRef, credentials: Credentials | None, on_bytes: ByteCallback) -> None:
        """Pulls the pinned image; `on_bytes` gets the bytes downloaded so far (layers already
        present are not downloaded again)."""
        ...

    async def start(self, spec: NotebookSpec, placement: Placement) -> Running:
        """Creates and starts the session's container; a second start of a running session's
        container returns it as it is."""
        ...

    async def exited(self, container_id: str) -> str | None:
        """None while the container runs; otherwise why it ended (exit code and its last output)."""
        ...

    async def stop(self, container_id: str, grace_s: float) -> None:
        """SIGTERM, up to `grace_s` to end, then SIGKILL; then removes the container."""
        ...

    async def session_containers(self) -> list[SessionContainer]:
        """Every container carrying the session label, with its processes."""
        ...


def container_name(session_id: str) -> str:
    return f"notebook-{session_id}"


def create_body(spec: NotebookSpec, placement: Placement) -> dict:
    """The Docker Engine API's ContainerCreate body for the session's notebook."""
    port = f"{placement.port}/tcp"
    host: dict = {
        "Binds": [f"{placement.workspace}:{placement.workspace_mount}"],
        "PortBindings": {port: [{"HostIp": placement.host_ip,
                                 "HostPort": str(placement.host_port) if placement.host_port else ""}]},
        "RestartPolicy": {"Name": "no"},
    }
    if spec.cpus:
        host["NanoCpus"] = int(spec.cpus * 1e9)
    if spec.memory_bytes:
        host["Memory"] = spec.memory_bytes
    if spec.gpus or spec.gpu_ids:
        request: dict = {"Driver": "nvidia", "Capabilities": [["gpu"]]}
        if spec.gpu_ids:
            request["DeviceIDs"] = list(spec.gpu_ids)
        else:
            request["Count"] = spec.gpus
        host["DeviceRequests"] = [request]
    return {
        "Image": spec.image.pinned,
        "Env": [f"{placement.secret_env}={spec.secret}"],
        "Labels": {SESSION_LABEL: spec.session_id, USER_LABEL: spec.user, CLUSTER_LABEL: spec.cluster},
        "ExposedPorts": {port: {}},
        "WorkingDir": placement.workspace_mount,
        "HostConfig": host,
    }


class PullBytes:
    """Bytes downloaded in a pull, from the engine's stream, per layer (the stream's id is the
    first 12 hex digits of the layer's digest): the latest progressDetail.current while it
    downloads, its whole size once complete. docker streams byte counts as it goes; podman may
    say only "Download complete", so a layer's size comes from the stream's total or, failing
    that, from `sizes` (the manifest's, as the cluster knows it). A layer the host already holds
    ("Already exists") downloads nothing."""

    def __init__(self, sizes: dict[str, int] | None = None) -> None:
        self._sizes = {short_id(d): n for d, n in (sizes or {}).items()}
        self._layers: dict[str, int] = {}

    def feed(self, message: dict) -> int:
        """Takes one message of the stream; returns the bytes done so far."""
        if "error" in message or "errorDetail" in message:
            detail = message.get("errorDetail") or {}
            raise ContainerError(str(detail.get("message") or message.get("error")))
        layer, status = message.get("id", ""), message.get("status", "")
        progress = message.get("progressDetail") or {}
        if layer and status == "Downloading" and progress.get("current") is not None:
            self._layers[layer] = int(progress["current"])
            if progress.get("total"):
                self._sizes.setdefault(layer, int(progress["total"]))
        elif layer and status in ("Download complete", "Pull complete") and layer in self._sizes:
            self._layers[layer] = self._sizes[layer]
        return self.done

    @property
    def done(self) -> int:
        return sum(self._layers.values())


def short_id(digest: str) -> str:
    """A layer's id in the engine's pull stream."""
    return digest.removeprefix("sha256:")[:12]
