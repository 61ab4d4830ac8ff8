"""A fleet's model clock never runs backwards across restarts, whatever each start's time scale:
`up` (x30 by default), then `serve` (x1), then `up` again go on from where the last left off."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime

from local_up import PROVISIONER, Up, clusters_on_free_ports, front_of
from provisioner.common.clock import Anchor, fleet_anchor, fleet_clock, next_anchor


def test_a_new_scale_starts_from_the_model_time_the_old_one_reached():
    first = next_anchor(None, 30.0, wall=1000.0)
    assert first == Anchor(1000.0, 1000.0, 30.0)
    assert next_anchor(first, 30.0, wall=1100.0) is first  # one fleet, one anchor
    slower = next_anchor(first, 1.0, wall=1100.0)
    assert slower == Anchor(1100.0, 1000.0 + 100 * 30, 1.0)
    faster = next_anchor(slower, 30.0, wall=1200.0)
    assert faster.model == slower.model_at(1200.0) == 4100.0


def test_the_anchor_is_kept_in_the_data_dir_and_a_legacy_origin_is_taken_over(tmp_path):
    (tmp_path / "clock-origin").write_text("500.0")
    assert fleet_anchor(tmp_path, 30.0, wall=600.0) == Anchor(500.0, 500.0, 30.0)
    assert fleet_anchor(tmp_path, 1.0, wall=700.0) == Anchor(700.0, 500.0 + 200 * 30, 1.0)
    assert json.loads((tmp_path / "clock.json").read_text())["scale"] == 1.0
    clock = fleet_clock(tmp_path, 1.0)
    assert clock.now() >= 500.0 + 200 * 30


async def _model_now(front: str, data_dir) -> float:
    """The fleet's model time as a new session reports it (its read_time)."""
    proc = await asyncio.create_subprocess_exec(
        str(PROVISIONER), "session", "create", "--user", "ada", "--accelerator", "gpu-p100", "--image",
        "gpu:latest", "--front", front, "--data-dir", str(data_dir), "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    return datetime.fromisoformat(json.loads(out)["read_time"]).timestamp()


async def test_up_x30_then_x1_then_x30_never_goes_back(tmp_path):
    clusters, data = clusters_on_free_ports(tmp_path / "clusters"), tmp_path / "data"
    seen, walls = [], []
    for scale in (30, 1, 30):
        up = Up(clusters, data, time_scale=scale)
        await up.started()
        try:
            if scale == 30:
                await asyncio.sleep(3)  # 90 model seconds
            seen.append(await _model_now(front_of(clusters), data))
            walls.append(time.time())
        finally:
            await up.stop()
    assert seen == sorted(seen), seen
    # The x1 start went on from the x30 run (at least 87 s ahead of the wall), not from the wall clock.
    assert seen[1] - walls[1] > 60


def test_times_shown_say_whose_clock_they_are():
    from provisioner.cli import render
    from provisioner.observability import traceview
    from provisioner.v1 import types_pb2

    s = types_pb2.Session(id="c.s1", state=types_pb2.SESSION_STATE_QUEUED)
    s.create_time.FromSeconds(10_000)
    s.read_time.FromSeconds(10_000)
    s.estimated_ready_time.FromSeconds(10_600)
    # the fleet's clock three hours ahead of the wall: a sped-up fleet's model time
    assert "ready in ~10m (model time)" in render.progress_line(s, 10_000 - 3 * 3600)
    assert "(model time)" not in render.progress_line(s, 10_000)
    assert "model time, 3h ahead of the wall clock" in render.session_detail(s, 10_000 - 3 * 3600)
    header, row = render.session_table([s], 10_000).splitlines()
    assert header.split()[5:7] == ["AGE", "READY-IN"] and row.split()[5:7] == ["0s", "10m"]
    spans = [{"trace_id": "t", "span_id": "a", "name": "cli", "start_ns": 0, "end_ns": 1_000_000}]
    assert "wall-clock ms" in traceview.render_tree(spans, "t").splitlines()[0]
