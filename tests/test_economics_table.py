"""docs/economics.md: its table is made from the `simulate --json` runs kept beside it, placed
between markers in a page written by hand; the replay benchmark's comparison and trace window."""

from __future__ import annotations

import json
from pathlib import Path

from provisioner.perf import replay, tables
from provisioner.sim.trace import read_trace

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "economics.md"
RUN = {"trace": "t.csv", "scale": 50, "days": None, "policy": "per pool", "sessions": 1000, "model_hours": 48.0,
       "vm_hours": 1200.0, "standby_vm_hours": 300.0, "cost_usd": 2200.0, "assigned_cost_usd": 2000.0,
       "fast_start_ratio": 0.9975, "wait_p99_s": 0.0, "never_started": 2, "wall_s": 3.0,
       "command": "provisioner simulate --trace t.csv --scale 50"}


def test_the_table_goes_between_the_markers_and_nowhere_else(tmp_path):
    run = tmp_path / "t.json"
    run.write_text(json.dumps(RUN))
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\nprose before\n\n{tables.BEGIN}\nstale\n{tables.END}\n\nprose after\n")
    assert tables.main([str(run), "--out", str(page), "--between-markers", "--check"]) == 1  # stale
    assert tables.main([str(run), "--out", str(page), "--between-markers"]) == 0
    text = page.read_text()
    assert text.startswith("# Title\n\nprose before\n\n") and text.endswith(f"{tables.END}\n\nprose after\n")
    assert "stale" not in text and "| t.csv | 50 | all 2.0 | per pool | 1,000 |" in text and "1.100x" in text
    assert tables.main([str(run), "--out", str(page), "--between-markers", "--check"]) == 0
    page.write_text(text.replace("prose after", "prose changed by hand"))  # prose is the page's own
    assert tables.main([str(run), "--out", str(page), "--between-markers", "--check"]) == 0
    page.write_text("no markers\n")
    assert tables.main([str(run), "--out", str(page), "--between-markers"]) == 1
    assert page.read_text() == "no markers\n"


def test_runs_with_a_spot_tier_add_its_columns_and_the_others_read_as_on_demand():
    tier = {**RUN, "command": RUN["command"] + " --spot-tier 0.05", "cost_usd": 1800.0, "assigned_cost_usd": 1500.0,
            "assigned_on_demand_cost_usd": 2000.0, "spot_vm_hours": 400.4, "spot_preemptions": 31, "requeued": 12,
            "requeued_started": 11}
    table = tables.simulate_table([RUN, tier])
    header, _, on_demand, spot = table.splitlines()[2:6]
    assert "| standby VM-hours | Spot VM-hours | cost vs assigned | vs on demand |" in header
    assert "| never started | preemptions: requeued (ran) | wall |" in header
    assert "| 300 | 0 | 1.100x | 1.100x |" in on_demand and "| 2 | - |" in on_demand
    assert "| per pool, Spot tier (0.05 preemptions per VM-hour) |" in spot
    assert "| 300 | 400 | 1.200x | 0.900x |" in spot and "| 2 | 31: 12 (11) |" in spot
    assert "Spot VM-hours" not in tables.simulate_table([RUN])  # no Spot run: the table as it was


def test_the_shipped_economics_table_is_what_its_runs_give():
    runs = sorted((ROOT / "docs" / "economics").glob("*.json"))
    assert runs
    assert tables.main([*map(str, runs), "--out", str(PAGE), "--between-markers", "--check"]) == 0
    for r in map(json.loads, (p.read_text() for p in runs)):
        assert r["scale"] == 50 and f"`{r['command']} --json`" in PAGE.read_text()


def test_the_benchmark_compares_every_figure_but_the_wall_time():
    old = {"sessions": 10, "wall_s": 1.0, "pools": {"a/p": {"idle_vm_hours": 1.5}}, "events": 7}
    assert replay.differences(old, {**old, "wall_s": 9.0, "command": "provisioner simulate", "days": 2.0}) == []
    new = {**old, "pools": {"a/p": {"idle_vm_hours": 1.25}}, "extra": 1}
    assert replay.differences(old, new) == ["extra: None != 1", "pools.a/p.idle_vm_hours: 1.5 != 1.25"]


def test_the_benchmark_window_is_the_traces_first_days(tmp_path):
    trace = ROOT / "provisioner" / "sim" / "traces" / "openb-sessions.csv"
    rows = read_trace(trace)
    t0 = rows[0].arrival_s
    window = read_trace(replay.window(trace, 2, tmp_path / "w.csv"))
    assert window == [r for r in rows if r.arrival_s - t0 < 2 * 86400] and 0 < len(window) < len(rows)
