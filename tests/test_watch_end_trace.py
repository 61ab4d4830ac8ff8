"""The normal end of `session create --wait` (the CLI hangs up the watch once the session runs) is
not recorded in the fleet's traces as an error of WatchSession."""

from __future__ import annotations

import asyncio
import json

from conftest import fleet_config, quick_warm_up, warm_fleet
from provisioner import cli
from provisioner.observability import telemetry
from provisioner.observability import traceview

WATCH = "/provisioner.v1.SessionService/WatchSession"


def _cold(cluster: dict) -> None:
    """No warm VMs: a new session waits for one, so --wait watches it."""
    quick_warm_up(cluster)
    for pool in cluster["pools"]:
        pool.update(min_vms=0, headroom_fraction=0.0)


async def test_a_wait_that_ends_normally_leaves_no_error_span(tmp_path, capsys):
    spans_file = tmp_path / "spans.jsonl"
    provider = telemetry.setup_tracing("fleet", exporter="file", file_path=spans_file)
    async with warm_fleet(fleet_config(tmp_path, _cold), tmp_path / "data",
                          tracer_provider=provider) as fleet:
        argv = ["session", "create", "--user", "ada", "--accelerator", "gpu-p100", "--image", "gpu:latest",
                "--wait", "--json", "--front", fleet.front_address, "--data-dir", str(fleet.data_dir)]
        assert await asyncio.to_thread(cli.main, argv) == 0
        assert json.loads(capsys.readouterr().out)["state"] == "running"
        for _ in range(100):  # the server's span ends once it hears of the hang-up
            provider.force_flush()
            watches = [s for s in traceview.load_spans(spans_file) if s["name"] == WATCH]
            if watches:
                break
            await asyncio.sleep(0.05)
    telemetry.shutdown_tracing(provider)
    assert watches
    spans = traceview.load_spans(spans_file)
    for trace_id in {s["trace_id"] for s in watches}:
        tree = traceview.render_tree(spans, trace_id)
        assert "Watch" in tree and "ERROR" not in tree, tree
