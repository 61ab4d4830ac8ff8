"""The `registry:` section of clusters/images.yaml: where the fleet's images come from and how to
authenticate (provisioner/registry/source.py opens the feed it describes)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveFloat, model_validator

from provisioner.config.base import _At, _Model

METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"


class RegistryAuthConfig(_Model):
    kind: Literal["none", "basic", "gce_metadata"] = "none"
    username: str = ""
    password_file: str = ""  # basic: a file holding the password (never the password itself)
    metadata_url: str = METADATA_URL  # gce_metadata: the metadata server

    @model_validator(mode="after")
    def _check(self) -> RegistryAuthConfig:
        if self.kind == "basic" and not (self.username and self.password_file):
            raise _At("username", "basic authentication needs username and password_file")
        return self


class RegistryImagesConfig(_Model):
    url: str = Field(pattern=r"^https?://[^/]+$")
    repository: str = Field(pattern=r"^[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
    name: str = Field(default="", pattern=r"^([a-z0-9][a-z0-9._/-]*)?$")
    latest: str = ""
    refresh_s: PositiveFloat = 300.0
    ca_file: str | None = None
    auth: RegistryAuthConfig = RegistryAuthConfig()

    def resolved(self, base: Path) -> RegistryImagesConfig:
        """The same with relative file names made absolute against `base`."""
        def at(name: str | None) -> str | None:
            return str(base / name) if name and not Path(name).is_absolute() else name

        auth = self.auth.model_copy(update={"password_file": at(self.auth.password_file) or ""})
        return self.model_copy(update={"ca_file": at(self.ca_file), "auth": auth})
