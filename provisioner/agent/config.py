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
    # Where image layers come from: each layer is published as `<layer_repository>:<layer id>`.
    layer_repository: str = "us-docker.pkg.dev/notebooks/gpu/layers"
    runtime: str = Field(default="auto", pattern="^(auto|containerd|docker)$")
    # A session's things: containers with this label, processes of users with uid >= this,
    # and these directories (emptied, not removed). The image cache is elsewhere and kept.
    session_label: str = "provisioner-session"
    user_uid_min: int = 1000
    user_paths: tuple[Path, ...] = (Path("/home/notebook"), Path("/scratch"))
    kill_grace_s: PositiveFloat = 10.0
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
