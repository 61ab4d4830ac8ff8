"""Quotas in a replay: the front's checks (provisioner.rules.quota) applied to each create, and a flood."""

from __future__ import annotations

from test_simulate import write_trace

from provisioner.sim.parallel import Run, simulate
from provisioner.sim.trace import FLOOD_USER, read_trace, with_flood

HOUR = 3600


def test_the_active_session_cap_and_the_weekly_budget_refuse_creates_as_the_front_does(tmp_path):
    # 1970-01-05 is a Monday: the quota week resets at its midnight (the default). u1 opens six
    # sessions at once (the cap is 4); u2 runs 4 GPU-hours a day (two 2-hour sessions on a
    # 2-GPU pool) and runs out of its 30 hours on the fourth day: its second session that day
    # starts with 2 of 8 GPU-hours left and is stopped an hour in, as the cluster stops it.
    monday = 4 * 24 * HOUR
    rows = [f"{monday + i},u1,interactive,gpu-p100,gpu:v160,us-central1,{HOUR},0" for i in range(6)]
    for day in range(7):
        for k in range(2):
            rows.append(f"{monday + day * 24 * HOUR + 600 + k * 3 * HOUR},u2,batch,gpu-t4x2,gpu:v160,us-central1,"
                        f"{2 * HOUR},0")
    trace = str(write_trace(tmp_path, rows))
    results = simulate(Run(trace, quotas=True)).results()
    assert results["refused_for_quota"] == {"gpu_hours_per_week": 6, "max_active_sessions": 2}
    assert results["sessions"] == len(rows) - 8
    assert results["stopped_for_budget"] == 1
    unchecked = simulate(Run(trace)).results()  # checked only when asked
    assert (unchecked["refused_for_quota"], unchecked["stopped_for_budget"]) == ({}, 0)


def test_a_flood_is_refused_past_the_cap_and_the_others_start_at_once(tmp_path):
    rows = [f"{i * 60},u{i},interactive,gpu-p100,gpu:v160,us-central1,{HOUR},0" for i in range(40)]
    trace = str(write_trace(tmp_path, rows))
    flooded = with_flood(read_trace(trace), 200)
    assert sum(r.user == FLOOD_USER for r in flooded) == 200 and len(flooded) == 240
    results = simulate(Run(trace, quotas=True, flood=200)).results()
    assert results["refused_for_quota"] == {"max_active_sessions": 196}
    assert results["sessions"] == 44
    assert results["users"]["count"] == 41


def test_quotas_over_users_in_several_regions_are_counted_in_one_process(tmp_path):
    # u1 opens three sessions in each of two regions: the cap of 4 sees all six only if one
    # process replays both clusters.
    rows = [f"{i},u1,interactive,gpu-p100,gpu:v160,{('us-central1', 'europe-west4')[i % 2]},{HOUR},0"
            for i in range(6)]
    run = Run(str(write_trace(tmp_path, rows)), quotas=True)
    assert simulate(run, jobs=2).results()["refused_for_quota"] == {"max_active_sessions": 2}
