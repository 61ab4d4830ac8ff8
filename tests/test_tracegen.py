"""Held-out traces: arrivals from other public traces, modelled columns, and a file replay accepts."""

from __future__ import annotations

import csv
import random

from provisioner.sim import tracegen
from provisioner.sim.trace import read_trace
from provisioner.sim.tracegen import DAY_S, HOUR_S, Arrival, Pod


def test_thinning_keeps_the_hourly_shape_and_the_volume():
    counts = [100, 0, 400, 100] * 24
    arrivals = tracegen.thin_hourly(counts, 3_000, random.Random(1))
    assert 2_800 < len(arrivals) < 3_200
    per_hour = [0] * len(counts)
    for a in arrivals:
        per_hour[int(a.t_s // HOUR_S)] += 1
    assert per_hour[1::4] == [0] * 24  # an empty hour stays empty
    assert sum(per_hour[2::4]) > 3 * sum(per_hour[0::4])  # a busy hour stays busy
    assert [a.t_s for a in arrivals] == sorted(a.t_s for a in arrivals)


def test_a_burst_window_puts_each_hours_jobs_inside_ten_minutes_of_it():
    counts = [30, 0, 60] * 40
    arrivals = tracegen.thin_hourly(counts, 10_000, random.Random(2), window_s=600, kind="batch")
    by_hour: dict[int, list[float]] = {}
    for a in arrivals:
        by_hour.setdefault(int(a.t_s // HOUR_S), []).append(a.t_s)
    assert all(max(ts) - min(ts) <= 600 for ts in by_hour.values())
    assert len({round(min(ts) % HOUR_S) for ts in by_hour.values()}) > 10  # the window moves inside the hour
    assert {a.kind for a in arrivals} == {"batch"} and sum(counts) == len(arrivals)


def test_waves_put_each_few_hours_jobs_inside_one_short_window():
    counts = [10, 0, 20] * 40
    arrivals = tracegen.thin_hourly(counts, 10_000, random.Random(4), window_s=180, kind="batch", every_h=3)
    by_wave: dict[int, list[float]] = {}
    for a in arrivals:
        by_wave.setdefault(int(a.t_s // (3 * HOUR_S)), []).append(a.t_s)
    assert all(len(ts) == 30 and max(ts) - min(ts) <= 180 for ts in by_wave.values())  # 3 hours' jobs together
    assert len({round(min(ts) % (3 * HOUR_S)) for ts in by_wave.values()}) > 10  # the window moves inside them
    # One hour at a time, the draws are those of the hourly thinning: the bundled traces stay the same.
    hourly = tracegen.thin_hourly(counts, 500, random.Random(5), window_s=600)
    assert hourly == tracegen.thin_hourly(counts, 500, random.Random(5), window_s=600, every_h=1)


def test_rollouts_keep_each_seconds_requests_together_and_the_order():
    # 5 requests in second 0, 1 in second 1, 3 in the last second (99); the 23 days span 100 s.
    times = [1_000.1, 1_000.5, 1_000.2, 1_000.9, 1_000.0, 1_001.3, 1_099.0, 1_099.5, 1_099.7]
    out = tracegen.rollouts(times, 100, 23, random.Random(0))
    step = 23 * DAY_S / 100
    assert [a.t_s for a in out] == [0.0] * 5 + [step] + [99 * step] * 3
    thinned = tracegen.rollouts(times * 100, 300, 23, random.Random(0))
    assert 200 < len(thinned) < 400 and thinned == sorted(thinned, key=lambda a: a.t_s)


def test_busiest_window_starts_on_the_day_with_the_most_events_after_it():
    times = [d * DAY_S + 5 for d in (0, 10, 11, 11, 12, 12, 12, 30)]
    assert tracegen.busiest_window(times, 3) == 10 * DAY_S
    assert tracegen.busiest_window([7.0], 23) == 0.0


def test_pods_keep_their_own_lifetime_and_kind_inside_the_window():
    pods = [Pod(100, 700, "LS", True), Pod(DAY_S, DAY_S + 40, "BE", True), Pod(5 * DAY_S, 5 * DAY_S + 9, "LS", True),
            Pod(200, 900, "Burstable", True)]
    out = tracegen.pod_arrivals(pods, 0.0, 2, random.Random(0))
    # The pod after the window and the QoS without a kind are left out.
    assert out == [Arrival(100, "interactive", 600), Arrival(DAY_S, "batch", 40)]
    shifted = tracegen.pod_arrivals(pods, 50.0, 1, random.Random(0))
    assert shifted == [Arrival(50, "interactive", 600), Arrival(DAY_S - 50, "batch", 40)]


def test_running_pod_borrows_a_finished_lifetime_of_its_qos():
    pods = [Pod(0, 50, "BE", True), Pod(10, 99_999, "BE", False)]
    out = tracegen.pod_arrivals(pods, 0.0, 1, random.Random(0))
    assert [(a.kind, a.length_s) for a in out] == [("batch", 50), ("batch", 50)]


def test_modelled_columns_follow_the_documented_mix():
    rng = random.Random(3)
    arrivals = [Arrival(i * 60.0) for i in range(20_000)]
    rows = tracegen.sessions_for(arrivals, [10.0, 100.0, 99_999.0], rng)
    n = len(rows)
    share = lambda pred: sum(map(pred, rows)) / n  # noqa: E731
    assert abs(share(lambda r: r[2] == "interactive") - 0.7) < 0.02
    assert abs(share(lambda r: r[3] == "gpu-p100") - 0.7) < 0.02
    assert abs(share(lambda r: r[5] == "us-central1") - 0.5) < 0.02
    interactive = [r for r in rows if r[2] == "interactive"]
    assert abs(sum(r[7] for r in interactive) / len(interactive) - 0.35) < 0.02
    assert all(r[7] == 0 for r in rows if r[2] == "batch")
    assert {r[6] for r in rows} == {30, 100, 12 * HOUR_S}  # clipped to 30 s .. 12 h
    # A user keeps their region and, when pinned, their release.
    seen: dict[str, str] = {}
    for r in rows:
        assert seen.setdefault(r[1], r[5]) == r[5]
    latest = {tracegen.newest_release(r[0]) for r in rows}
    versions = {int(r[4].removeprefix("gpu:v")) for r in rows}
    assert versions - latest and min(versions) >= tracegen.NEWEST_AT_START - tracegen.PINNED_RELEASES


def write_raw(d):
    with open(d / tracegen.RAW_FILES["spot"], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["submit_hour", "jobs", "gpu_seconds", "gpu_demand"])
        w.writerows([h, 9999 if h == 0 else 20 + (h % 24), 0, 0] for h in range(24 * 150))
    with open(d / tracegen.RAW_FILES["philly"], "w", newline="") as f:
        f.write("runtime\n0.0\n" + "".join(f"{60 * k}.0\n" for k in range(1, 100)))
    with open(d / tracegen.RAW_FILES["openb"], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
                    "creation_time", "deletion_time", "scheduled_time"])
        for i in range(400):
            t = 40 * DAY_S + i * 3_000
            w.writerow([f"p{i}", 1, 1, 1, 1000, "", ("LS", "BE")[i % 2], ("Succeeded", "Running")[i % 3 == 0],
                        t, t + 1_000 + i if i % 3 else 90 * DAY_S, t])
    with open(d / tracegen.RAW_FILES["azure_code"], "w", newline="") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        f.writelines(f"2023-11-16 18:{17 + i // 60:02d}:{i % 60:02d}.{i:07d},100,10\n" for i in range(600))


def test_cli_writes_traces_that_replay_reads(tmp_path, capsys):
    raw = tmp_path / "raw"
    raw.mkdir()
    write_raw(raw)
    assert tracegen.main(["--raw", str(raw), "--out", str(tmp_path / "out")]) == 0
    for name in ("spot-steady", "spot-burst", "openb", "batch-burst", "batch-wave", "rollout"):
        rows = read_trace(tmp_path / "out" / f"{name}-sessions.csv")
        assert rows and max(r.arrival_s for r in rows) < tracegen.WINDOW_DAYS * DAY_S
    openb = read_trace(tmp_path / "out" / "openb-sessions.csv")
    assert len(openb) == 400 and openb[0].arrival_s == 0  # the window starts at the first busy day
    assert {r.kind.value for r in read_trace(tmp_path / "out" / "batch-burst-sessions.csv")} == {"batch"}
    wave = read_trace(tmp_path / "out" / "batch-wave-sessions.csv")
    assert {r.kind.value for r in wave} == {"batch"}
    assert len({r.arrival_s // (tracegen.WAVE_EVERY_H * HOUR_S) for r in wave}) <= tracegen.WINDOW_DAYS * 24 // 3
    rollout = read_trace(tmp_path / "out" / "rollout-sessions.csv")
    assert len(rollout) == 600 and rollout[0].arrival_s == 0  # 600 requests, fewer than the genai volume: all kept
    assert "openb-sessions.csv: 400 sessions" in capsys.readouterr().out
    assert tracegen.main(["--raw", str(tmp_path / "nowhere")]) == 1
    assert "missing" in capsys.readouterr().err


def test_same_seed_same_traces(tmp_path):
    write_raw(tmp_path)
    assert tracegen.build(tmp_path, 5) == tracegen.build(tmp_path, 5)
    assert tracegen.build(tmp_path, 5)["spot-steady"] != tracegen.build(tmp_path, 6)["spot-steady"]
