"""A session's life on the VM, as the agent's commands carry it out: pull its pinned image, start
its notebook container, stop it, and the wipe after it.

The wipe touches only what the runtime labelled as a session's: its containers (stopped, then
removed, which ends their processes) and the workspaces under `workspace_root`. It never signals
a process by uid or name. Then it checks that nothing of the session is left (containers,
processes of their pid namespaces, workspace files, GPU compute processes) and resets the GPUs
only when nothing holds them.
"""

from __future__ import annotations

from pathlib import Path

from provisioner.agent.config import AgentConfig
from provisioner.agent.gpu import Gpus
from provisioner.agent.host import Host
from provisioner.agent.metadata import Metadata
from provisioner.agent.runtime import (ByteCallback, ContainerError, Credentials, ImageRef, NotebookSpec,
                                       Placement, Running, Runtime)
from provisioner.common.clock import Clock

OAUTH_USER = "oauth2accesstoken"  # Artifact Registry's user name for an access token


class Notebooks:
    def __init__(self, cfg: AgentConfig, runtime: Runtime, host: Host, gpus: Gpus, metadata: Metadata, clock: Clock):
        self.cfg, self.runtime, self.host, self.gpus = cfg, runtime, host, gpus
        self.metadata, self.clock = metadata, clock

    async def credentials(self) -> Credentials | None:
        cfg = self.cfg
        if cfg.registry_auth == "metadata":
            return Credentials(OAUTH_USER, await self.metadata.access_token())
        if cfg.registry_auth == "basic":
            password = cfg.registry_password_file.read_text().strip() if cfg.registry_password_file else ""
            return Credentials(cfg.registry_username, password)
        return None

    async def pull(self, command: dict, on_bytes: ByteCallback) -> None:
        image = image_of(command)
        await self.runtime.pull(image, await self.credentials() if image.repository else None, on_bytes)

    def workspace(self, session_id: str) -> Path:
        if not session_id or "/" in session_id or session_id.startswith("."):
            raise ValueError(f"not a session id: {session_id!r}")
        return self.cfg.workspace_root / session_id

    async def start(self, command: dict) -> Running:
        """Runs the session's notebook; returns once its server answers, or raises with the
        reason its container ended (or that it never answered)."""
        cfg = self.cfg
        spec = NotebookSpec(str(command["session_id"]), str(command.get("user", "")),
                            str(command.get("cluster", "")), image_of(command), str(command["secret"]),
                            float(command.get("cpus", 0)), int(command.get("memory_bytes", 0)),
                            int(command.get("gpus", 0)), tuple(command.get("gpu_ids", ())))
        workspace = self.workspace(spec.session_id)
        self.host.make_dir(workspace)
        placement = Placement(str(workspace), cfg.workspace_mount, cfg.notebook_port, cfg.publish_ip,
                              cfg.publish_port, cfg.secret_env)
        running = await self.runtime.start(spec, placement)
        deadline = self.clock.now() + cfg.start_timeout_s
        while not self.host.answers(running.host_port):
            if (why := await self.runtime.exited(running.container_id)) is not None:
                raise ContainerError(why)
            if self.clock.now() >= deadline:
                raise ContainerError(f"the notebook did not answer on port {running.host_port} "
                                     f"within {cfg.start_timeout_s:.0f}s")
            await self.clock.sleep(0.25)
        return running

    async def stop(self, session_id: str) -> None:
        for c in await self.runtime.session_containers():
            if c.session_id == session_id:
                await self.runtime.stop(c.id, self.cfg.kill_grace_s)

    async def wipe(self) -> str:
        """Ends everything of the last session, keeps the image cache, resets the GPUs when free,
        then checks: a wipe that cannot be verified is a failure (the VM is deleted, not reused)."""
        containers = await self.runtime.session_containers()
        pids = sorted({pid for c in containers for pid in self.host.in_namespace(c.pid)})
        for c in containers:
            await self.runtime.stop(c.id, self.cfg.kill_grace_s)
        root = self.cfg.workspace_root
        self.host.clear(root)
        problems = []
        if left := await self.runtime.session_containers():
            problems.append(f"containers left: {', '.join(c.id[:12] for c in left)}")
        if procs := self.host.alive(pids):
            problems.append(f"processes left: {', '.join(f'{p.name} ({p.pid})' for p in procs)}")
        if entries := self.host.entries(root):
            problems.append(f"workspaces left: {', '.join(entries)}")
        if skipped := await self.gpus.reset():
            problems.append(skipped)
        elif busy := self.gpus.busy():
            problems.append(f"GPU still used by {', '.join(busy)}")
        return "ok" if not problems else "error: the wipe could not be verified: " + "; ".join(problems)


def image_of(command: dict) -> ImageRef:
    """The image a command names: repository and digest, and the layers the cluster expects."""
    layers = tuple((str(layer["id"]), int(layer["bytes"])) for layer in command.get("layers", []))
    return ImageRef(str(command.get("repository", "")), str(command.get("digest", "")), layers)
