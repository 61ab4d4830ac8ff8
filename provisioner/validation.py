"""Request checks shared by the front and the clusters, so both refuse the same things."""

from __future__ import annotations

from typing import Collection

from provisioner.errors import InvalidArgument, quote
from provisioner.decide.images import ImageCatalog
from provisioner.model import SessionSpec


def validate_spec(spec: SessionSpec, pools: Collection[str], catalog: ImageCatalog, max_runtime_limit_s: float) -> str:
    """Returns the resolved image version, or raises InvalidArgument naming the field."""
    if not spec.request_id.strip():
        raise InvalidArgument("request_id must not be empty", field="spec.request_id")
    if not spec.user_id.strip():
        raise InvalidArgument("user_id must not be empty", field="spec.user_id")
    if spec.accelerator not in pools:
        known = ", ".join(sorted(pools))
        raise InvalidArgument(f"unknown accelerator {quote(spec.accelerator)} (known: {known})", field="spec.accelerator")
    if spec.max_runtime_s < 0:
        raise InvalidArgument("max_runtime must not be negative", field="spec.max_runtime")
    if spec.max_runtime_s > max_runtime_limit_s:
        raise InvalidArgument(f"max_runtime exceeds the limit of {max_runtime_limit_s:.0f}s", field="spec.max_runtime")
    try:
        return catalog.resolve(spec.image)
    except InvalidArgument as err:
        raise InvalidArgument(err.message, field="spec.image") from None
