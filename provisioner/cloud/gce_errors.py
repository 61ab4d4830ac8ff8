"""Compute Engine's errors as CloudFailures: what failed, and how far the failure reaches.

A quota is per metric and scope (Google: "Quota 'NVIDIA_T4_GPUS' exceeded. Limit: 8.0 in region
us-central1." or "Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally."; an operation's error
also carries it as `errorDetails[].quotaInfo` with the region among its dimensions). A regional
quota fails every zone of the region alike, a global one every region: the failure says so. A
stockout is one zone's, and may name the zones that have the shape now
(`errorDetails[].errorInfo.metadatas.zonesAvailable`).
"""

from __future__ import annotations

import contextlib
import re

import requests
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exceptions
from google.cloud import compute_v1

from provisioner.cloud.base import CloudFailure

STOCKOUT_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")
_QUOTA = re.compile(r"Quota '(?P<metric>[A-Z0-9_]+)' exceeded\.?\s*Limit: [\d.]+ (?P<where>globally|in region (?P<region>[a-z0-9-]+))")


def retryable(err: BaseException) -> bool:
    return isinstance(err, gexc.GoogleAPICallError) and failure_of(err, "").retryable


@contextlib.contextmanager
def transport_errors():
    """A timeout, a broken connection or a failed token refresh as a 503: like a server error, its
    outcome is unknown (and it is retried within the same bounds)."""
    try:
        yield
    except (requests.RequestException, auth_exceptions.TransportError, auth_exceptions.RefreshError) as err:
        raise gexc.ServiceUnavailable(f"transport: {err}") from err


def quota_failure(message: str, zone: str, accelerator: str, metric: str = "", region: str | None = None
                  ) -> CloudFailure:
    """A quota failure scoped as the quota is: project-wide (a global metric such as
    GPUS_ALL_REGIONS), else the region's. A GPU metric is shared by the pools of that GPU alone."""
    if (m := _QUOTA.search(message)) is not None:
        metric = metric or m["metric"]
        if region is None:
            region = m["region"] or ""
    project_wide = "ALL_REGIONS" in metric or region == ""
    gpu_metric = metric.endswith("_GPUS") and "ALL_REGIONS" not in metric
    return CloudFailure("quota", message, zone, scope="project" if project_wide else "region",
                        shared_by=accelerator if gpu_metric else "", metric=metric)


def failure_of(err: gexc.GoogleAPICallError, zone: str, accelerator: str = "") -> CloudFailure:
    text = str(err)
    # The REST error's reasons (e.g. quotaExceeded, rateLimitExceeded) are not in its message.
    signals = " ".join([text, err.reason or ""] + [str(e.get("reason", "")) for e in err.errors or ()
                                                    if isinstance(e, dict)])
    if "ZONE_RESOURCE_POOL_EXHAUSTED" in signals:
        return CloudFailure("stockout", text, zone)
    if isinstance(err, gexc.TooManyRequests) or "rateLimitExceeded" in signals:
        return CloudFailure("rate_limited", text, zone)
    if "QUOTA_EXCEEDED" in signals or "quotaExceeded" in signals:
        return quota_failure(text, zone, accelerator)
    # resourceNotReady: the instance is between states (e.g. still stopping); it will not stay so.
    if isinstance(err, gexc.ServerError) or "resourceNotReady" in signals:
        return CloudFailure("unavailable", text, zone)
    if isinstance(err, gexc.NotFound):
        return CloudFailure("not_found", text, zone)
    if isinstance(err, (gexc.BadRequest, gexc.Forbidden)):
        return CloudFailure("invalid", text, zone)
    return CloudFailure("internal", text, zone)


def operation_failure(op: compute_v1.Operation, zone: str, accelerator: str = "") -> CloudFailure | None:
    if not op.error or not op.error.errors:
        return None
    first = op.error.errors[0]
    message = f"{first.code}: {first.message}"
    if first.code == "QUOTA_EXCEEDED":
        for detail in first.error_details:
            if detail.quota_info.metric_name:
                info = detail.quota_info
                return quota_failure(message, zone, accelerator, info.metric_name.rsplit("/", 1)[-1].upper(),
                                     dict(info.dimensions).get("region", ""))
        return quota_failure(message, zone, accelerator)
    if first.code in STOCKOUT_CODES:
        available = next((d.error_info.metadatas["zonesAvailable"] for d in first.error_details
                          if "zonesAvailable" in d.error_info.metadatas), "")
        return CloudFailure("stockout", message, zone,
                            zones_available=tuple(z.strip() for z in available.split(",") if z.strip()))
    return CloudFailure("internal", message, zone)
