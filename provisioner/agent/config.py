"""The agent's settings: one YAML file (`--config`), every field optional."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
# XIDs that mean the GPU or its memory is broken, not that a user's program crashed (13, 31, 43
# are application faults): double-bit ECC, row remapping failures, fallen off the bus, etc.
FATAL_XIDS = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120)


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    metadata_url: str = METADATA_URL
    state_dir: Path = Path("/var/lib/provisioner-agent")
    # The container engine (Docker Engine API) and how it logs in to the registry: `metadata`,
    # the VM's service-account token as `oauth2accesstoken` (Artifact Registry); `basic`, a
    # user and a password read from a file; `none`.
    engine_url: str = "unix:///var/run/docker.sock"
    registry_auth: str = Field(default="metadata", pattern="^(metadata|basic|none)$")
    registry_username: str = ""
    registry_password_file: Path | None = None
    # A session's notebook container: its workspace is <workspace_root>/<session id> on the host,
    # mounted at workspace_mount; its server's port is published on publish_ip:publish_port
    # (0: a port the engine picks, reported with the start); the secret is in secret_env.
    workspace_root: Path = Path("/var/lib/provisioner-agent/workspaces")
    workspace_mount: str = "/home/jovyan/work"
    notebook_port: int = 8888
    publish_ip: str = "0.0.0.0"
    publish_port: int = Field(default=8888, ge=0, lt=65536)
    secret_env: str = "NOTEBOOK_TOKEN"
    start_timeout_s: PositiveFloat = 120.0  # for the notebook's server to answer
    kill_grace_s: PositiveFloat = 10.0  # between a container's SIGTERM and its SIGKILL
    # The usage report names the processes of users with uid >= this (read, never signalled).
    user_uid_min: int = 1000
    # Health thresholds: crossing one makes the VM unhealthy, with the reason as its detail.
    gpu_temperature_max_c: float = 85.0  # GPUs throttle from about here
    fatal_xids: tuple[int, ...] = FATAL_XIDS
    ecc_uncorrected_max: int = 0
    disk_free_min_fraction: float = Field(default=0.02, ge=0.0, lt=1.0)
    disk_paths: tuple[Path, ...] = (Path("/"), Path("/home"), Path("/scratch"))
    # Loops: health every health_s; pull progress at most every progress_s; a metadata
    # wait-for-change holds for watch_timeout_s before it is asked again.
    health_s: PositiveFloat = 30.0
    progress_s: PositiveFloat = 5.0
    watch_timeout_s: PositiveFloat = 60.0
    # Compute Engine documents about 10 guest attribute writes a minute per VM (more may be dropped).
    guest_writes_per_minute: int = Field(default=10, ge=4)


def load(path: Path | None) -> AgentConfig:
    if path is None:
        return AgentConfig()
    return AgentConfig.model_validate(yaml.safe_load(Path(path).read_text()) or {})
