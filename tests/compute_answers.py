"""What Compute Engine answers, as its documentation gives it, for the fake (tests/fake_compute.py):
quota errors with their metric and scope, stockouts with the zones that have the shape, and the
inserts it refuses."""

from __future__ import annotations

import re

NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def gpu_metric(accelerator_type: str) -> str:
    """The quota metric of a GPU type: nvidia-tesla-t4 -> NVIDIA_T4_GPUS, nvidia-l4 -> NVIDIA_L4_GPUS."""
    name = accelerator_type.rsplit("/", 1)[-1].replace("nvidia-tesla-", "nvidia-")
    return name.upper().replace("-", "_") + "_GPUS"


def quota_message(metric: str, region: str) -> str:
    where = "globally" if region == "global" else f"in region {region}"
    return f"Quota '{metric}' exceeded.  Limit: 0.0 {where}."


def invalid_insert(body: dict, custom_networks: set[str]) -> str | None:
    """What Compute refuses in an insert (400), of what the backends send."""
    name = body.get("name", "")
    if not NAME.match(name):
        return f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex '{NAME.pattern}'"
    scheduling = body.get("scheduling") or {}
    if body.get("guestAccelerators") and scheduling.get("onHostMaintenance") != "TERMINATE":
        return "Instances with guest accelerators do not support live migration."
    if scheduling.get("provisioningModel") == "SPOT" and scheduling.get("automaticRestart", True):
        return "Invalid value for field 'resource.scheduling.automaticRestart': 'true'. Spot VMs cannot restart automatically."
    for nic in body.get("networkInterfaces") or []:
        if nic.get("network") in custom_networks and not nic.get("subnetwork"):
            return ("Invalid value for field 'resource.networkInterfaces[0]': ''. Subnetwork should be "
                    "specified for custom subnetmode network")
    return None


def zone_error(project: str, zone: str, quota: tuple[str, str] | None, zones_available: list[str] | None,
               vm_type: str = "") -> dict:
    """A failed operation's error: a stockout unless `quota` (metric, region or "global") is what
    was exceeded. A stockout that names the zones with the shape now is
    ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS, its hint in a localized message and in the
    `errorInfo` metadata (`zonesAvailable`), as Compute gives it."""
    if quota is None:
        error = {"code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                 "message": f"The zone 'projects/{project}/zones/{zone}' does not have enough resources "
                            "available to fulfill the request.  Try a different zone, or try again later."}
        if zones_available:
            hint = ",".join(zones_available)
            error["code"] = "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"
            error["errorDetails"] = [
                {"localizedMessage": {"locale": "en-US", "message": (
                    f"A {vm_type} VM instance is currently unavailable in the {zone} zone. Consider trying your "
                    f"request in the {hint} zone(s), which currently has capacity to accommodate your request.")}},
                {"errorInfo": {"reason": "resource_availability", "domain": "compute.googleapis.com",
                               "metadatas": {"vmType": vm_type, "zone": zone, "zonesAvailable": hint}}}]
        return error
    metric, region = quota
    dimensions = {} if region == "global" else {"region": region}
    return {"code": "QUOTA_EXCEEDED", "message": quota_message(metric, region), "errorDetails": [
        {"quotaInfo": {"metricName": f"compute.googleapis.com/{metric.lower()}", "limit": 0,
                       "limitName": f"{metric.replace('_', '-')}-per-project" + ("" if region == "global" else "-region"),
                       "dimensions": dimensions}}]}


def http_status(code: str) -> int:
    """A failed operation's `httpErrorStatusCode`: 503 for a stockout, 403 for a quota."""
    if code.startswith("ZONE_RESOURCE_POOL_EXHAUSTED"):
        return 503
    return 403 if code == "QUOTA_EXCEEDED" else 500


def error_body(status: int, message: str, reason: str = "") -> dict:
    reason = reason or {404: "notFound", 409: "alreadyExists", 429: "rateLimitExceeded",
                        503: "backendError"}.get(status, "error")
    return {"error": {"code": status, "message": message, "errors": [{"reason": reason, "message": message}]}}


def label_filter(text: str) -> dict[str, str]:
    """labels.KEY = VALUE terms, joined by AND (the subset of the filter syntax the backend uses)."""
    return {k: v.strip('"') for k, v in re.findall(r"labels\.([\w-]+)\s*=\s*(\"[^\"]*\"|\S+)", text)}
