"""`simulate --days N` replays only the trace's first days; it prints one cost ratio; the results
tables in docs/results/ are made from `simulate --json` output by a script and match it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.cli import main
from provisioner.perf import tables
from provisioner.sim.trace import first_days, HEADER, read_trace

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
PROVISIONER = Path(sys.executable).with_name("provisioner")


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    # one session an hour for two days
    path = tmp_path_factory.mktemp("trace") / "t.csv"
    rows = [f"{i * 3600 + 60},u{i % 4},interactive,gpu-p100,gpu:v158,us-central1,1800,0" for i in range(48)]
    path.write_text("\n".join([",".join(HEADER), *rows]) + "\n")
    return path


@pytest.fixture(scope="module")
def one_day(trace) -> str:
    """`provisioner simulate --days 1 --json` on the trace: its output."""
    done = subprocess.run([str(PROVISIONER), "simulate", "--trace", str(trace), "--days", "1", "--json", "--jobs", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_days_keeps_the_sessions_of_the_first_days(trace, one_day):
    rows = read_trace(trace)
    assert len(first_days(rows, 1)) == 24 and first_days(rows, None) == rows
    r = json.loads(one_day)
    assert r["sessions"] == 24 and r["days"] == 1.0
    assert r["command"] == f"provisioner simulate --trace {trace} --scale 1 --days 1"
    assert main(["simulate", "--trace", str(trace), "--days", "0"]) == 2


def test_one_cost_ratio_is_printed(trace, capsys):
    assert main(["simulate", "--trace", str(trace), "--days", "0.5", "--jobs", "1"]) == 0
    report = capsys.readouterr().out
    assert "(its first 0.5)" in report and "vs bound" not in report
    assert report.count("x $") == 1 and "cost vs assigned" in report


def test_the_table_is_made_from_the_runs_json(tmp_path, one_day):
    (tmp_path / "a.json").write_text(one_day)
    out = tmp_path / "table.md"
    assert tables.main([str(tmp_path / "a.json"), "--out", str(out)]) == 0
    r = json.loads(one_day)
    [line] = [ln for ln in out.read_text().splitlines() if ln.startswith("| t.csv")]
    cells = [c.strip() for c in line.strip("|").split(" | ")]
    assert cells[:5] == ["t.csv", "1", "first 1", "per pool", "24"]
    assert cells[7] == f"{r['cost_usd'] / r['assigned_cost_usd']:.3f}x"
    assert cells[-1] == f"`{r['command']} --json`"
    assert tables.main([str(tmp_path / "a.json"), "--out", str(out), "--check"]) == 0
    out.write_text(out.read_text().replace(cells[7], "0.999x"))
    assert tables.main([str(tmp_path / "a.json"), "--out", str(out), "--check"]) == 1


def test_the_standby_table_names_each_policy_and_marks_the_target(one_day):
    r = json.loads(one_day)
    assert tables.setting("provisioner simulate --trace t.csv --policy fixed --warm-vms 20") == "fixed 20 warm"
    assert tables.setting("provisioner simulate --trace t.csv --policy headroom --headroom 0.2") == "headroom 0.2"
    assert tables.setting("provisioner simulate --trace t.csv --policy predictive") == "predictive + standby"
    assert tables.setting("provisioner simulate --trace t.csv --policy predictive --no-standby") == \
        "predictive, `--no-standby`"
    cells = tables.standby_row({**r, "cost_usd": r["assigned_cost_usd"] * 1.1, "fast_start_ratio": 0.999})
    assert cells[2] == "**1.100x**" and cells[9] == "yes"
    cells = tables.standby_row({**r, "cost_usd": r["assigned_cost_usd"] * 1.2, "fast_start_ratio": 0.999})
    assert cells[2] == "1.200x" and cells[9] == "no"


def test_the_shipped_results_table_is_what_its_runs_give():
    runs = sorted((RESULTS / "simulate").glob("*.json"))
    assert runs
    assert tables.main([*map(str, runs), "--out", str(RESULTS / "simulate.md"), "--check"]) == 0
