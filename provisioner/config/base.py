"""What every config model shares: strict frozen models, names, field types, and errors that name
the file and the field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# Names end up in VM names and session ids (`<cluster>.<id>`): DNS labels, no dots.
_NAME = r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$"
Name = Annotated[str, Field(pattern=_NAME)]


class _At(ValueError):
    """Raised by validators to point below their own level (pydantic keeps it in the error ctx)."""

    def __init__(self, path: str, reason: str):
        super().__init__(reason)
        self.path = path


class _Model(BaseModel):
    # Non-finite floats (.inf, .nan in YAML) are refused everywhere: none is a sane setting.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


GB = 1_000_000_000  # disk and image sizes are decimal, as clouds bill them


class ConfigError(Exception):
    """A config file is wrong. `field` is a dotted path inside the file, e.g. `pools[1].max_vms`."""

    def __init__(self, file: str | Path, field: str, reason: str,
                 more: tuple[tuple[str, str], ...] = ()):
        self.file = str(file)
        self.field = field
        self.reason = reason
        self.errors = ((field, reason),) + tuple(more)  # every problem found, first one first
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(f"{self.file}: {f}: {r}" for f, r in self.errors)


_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):(\d{1,5})$")


def _host_port(v: str) -> str:
    m = _HOST_PORT.match(v)
    if not m or not 1 <= int(m.group(3)) <= 65535:
        raise ValueError(f"expected host:port with a port in 1..65535, got {v!r}")
    return v


Address = Annotated[str, AfterValidator(_host_port)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]
