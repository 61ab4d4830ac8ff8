"""What every config model shares: strict frozen models, names, and pointing an error below a field."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

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
