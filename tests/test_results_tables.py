"""`simulate --days N` replays only the trace's first days; it prints one cost ratio; the results
tables in docs/results/ are made from `simulate --json` output by a script and match it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.cli import main
from provisioner.perf import bench_tables, tables
from provisioner.sim.trace import HEADER, first_days, read_trace

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


# Every results table of the docs made from committed runs: (page, marker, kind, the runs' folder).
SHIPPED = [("simulator.md", "standby", "standby", "standby"),
           ("performance.md", "serving", "serving", "serving/every-trace.json"),
           ("performance.md", "serving-sampled", "serving", "serving/sampled.json"),
           ("performance.md", "queue", "queue", "queue"),
           ("performance.md", "commits", "commits", "commits"),
           ("google-cloud.md", "spot", "spot", "spot"),
           ("priority-and-preemption.md", "preemption", "preemption", "preemption"),
           ("performance.md", "floods", "floods", "floods/floods.json")]


@pytest.mark.parametrize("page, marker, kind, runs", SHIPPED)
def test_the_docs_tables_are_what_their_committed_runs_give(page, marker, kind, runs):
    path = RESULTS / runs
    files = [path] if path.suffix == ".json" else sorted(path.glob("*.json"))
    assert files and all(f.is_file() for f in files)
    out = ROOT / "docs" / page
    assert tables.main(["--kind", kind, *map(str, files), "--out", str(out), "--marker", marker, "--check"]) == 0
    for r in map(json.loads, (f.read_text() for f in files)):
        assert f"`{r['command']} --json`" in out.read_text()


def test_a_page_holds_several_tables_each_between_its_own_markers(tmp_path):
    queue = {"creates": [], "stops": [{"queued": 9000, "stops": 1000, "ms_per_stop": 1.234, "moved_per_stop": 9500.4,
                                       "records_per_stop": 1.0}],
             "expired": {"sessions": 4999, "ms": 38.6}, "command": "python -m provisioner.perf.queue"}
    commits = {"rows": [{"writers": 8, "ungrouped": {"commits_per_s": 350.0},
                         "grouped": {"commits_per_s": 1120.4, "writes_per_transaction": 4.12}}],
               "store": "SQLite", "command": "python -m provisioner.perf.commits"}
    (tmp_path / "q.json").write_text(json.dumps(queue))
    (tmp_path / "c.json").write_text(json.dumps(commits))
    page = tmp_path / "page.md"
    (qb, qe), (cb, ce) = tables.markers("queue"), tables.markers("commits")
    page.write_text(f"# P\n\n{qb}\n{qe}\n\nbetween\n\n{cb}\n{ce}\n")
    assert tables.main(["--kind", "queue", str(tmp_path / "q.json"), "--out", str(page), "--marker", "queue"]) == 0
    assert tables.main(["--kind", "commits", str(tmp_path / "c.json"), "--out", str(page), "--marker", "commits"]) == 0
    text = page.read_text()
    assert "| a stop at the head, 9,000-10,000 queued | 1.23 | 9,500 | 1 | `python -m provisioner.perf.queue --json` |" in text
    assert "| 4,999 queued sessions timing out in one step | 39 |" in text
    assert "| SQLite | 8 | 350 | 1,120 | 4.1 | `python -m provisioner.perf.commits --json` |" in text
    assert text.index("9,000-10,000") < text.index("between") < text.index("| SQLite |")
    assert tables.main(["--kind", "queue", str(tmp_path / "q.json"), "--out", str(page), "--marker", "queue",
                        "--check"]) == 0
    page.write_text(text.replace("| 1.23 |", "| 0.50 |"))
    assert tables.main(["--kind", "queue", str(tmp_path / "q.json"), "--out", str(page), "--marker", "queue",
                        "--check"]) == 1


def test_the_serving_table_shows_each_level_s_ratio_rate_and_p99():
    run = {"vms": 200, "runs": 1, "seconds": 10.0, "command": "python -m provisioner.perf.serving --quick",
           "rows": [{"workload": "create", "in_flight": k, "ratio": 0.25,
                     "provisioner": {"calls_per_s": 250.0 * k, "p99_ms": 20.04}} for k in (1, 8)]}
    columns, rows = bench_tables.serving_rows([run])
    assert columns == ("workload", "1 in flight", "8 in flight", "runs", "warm VMs", "command")
    assert rows == [["CreateSession (warm)", "0.25 (250), p99 20.0 ms", "0.25 (2,000), p99 20.0 ms", "1 x 10 s", "200",
                     "`python -m provisioner.perf.serving --quick --json`"]]


def test_a_benchmark_records_the_command_that_ran_it(capsys):
    from provisioner.perf import queue
    assert queue.main(["--creates", "30", "--users", "3", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["command"] == "python -m provisioner.perf.queue --creates 30 --users 3"
    assert r["expired"]["sessions"] == 14 and r["stops"][-1]["records_per_stop"] == 1.0


def test_the_floods_table_marks_the_rows_that_miss_a_target():
    def client(ms, ready_ms=5.0):
        return {"ms": ms, "tcp_ms": 0.3, "ready_ms": ready_ms, "create_ms": round(ms - ready_ms, 1)}

    def row(flood, p50, vs_quiet, max_ms, new_client_ms=30.0, ramps=None):
        return {"fleet": "split", "flood": flood, "creates": 40, "p50_ms": p50, "p50_vs_quiet": vs_quiet,
                "max_ms": max_ms, "slowest_at_s": 0.5, "new_client": client(new_client_ms),
                "ramps": ramps and [{"client": c, "s": s} for c, s in ramps], "flood_calls": 300,
                "fleet_cpu_s": 2.5, "flood_cpu_s": 1.4, "load": 0.8}

    run = {"command": "python -m provisioner.perf.floods", "seconds": 20.0,
           "rows": [row("quiet", 15.0, 1.0, 22.0), row("list", 29.0, 1.93, 249.0), row("idle", 16.0, 1.07, 262.0),
                    row("quota", 31.0, 2.07, 40.0), row("refused", 16.0, 1.07, 40.0, new_client_ms=251.0),
                    row("idle", 16.0, 1.07, 40.0, ramps=[(client(60.0), 0.5), (client(1043.3, ready_ms=1027.4), 0.97),
                                                         (client(80.0), 0.62)]),
                    row("idle", 16.0, 1.07, 40.0, ramps=[(client(120.0), 0.4), (client(90.0), None)])]}
    columns, rows = bench_tables.floods_rows([run])
    assert columns[-2:] == ("targets", "command")
    assert [(r[1], r[-2]) for r in rows] == [("quiet", "met"), ("list", "met"), ("idle", "**missed**"),
                                             ("quota", "**missed**"), ("refused", "**missed**"),
                                             ("idle", "**missed**"), ("idle", "met")]
    assert rows[2][3:10] == ["16.0 ms", "1.07x", "262.0 ms", "0.5 s", "30.0 ms", "", ""]
    assert rows[5][8:10] == ["80.0 ms; max 1,043.3 ms (ready 1,027.4, create 15.9) of 3", "0.50-0.97 s"]
    assert rows[6][8:10] == ["90.0 ms; max 120.0 ms (ready 5.0, create 115.0) of 2", "not all held"]
    assert rows[0][-1] == "`python -m provisioner.perf.floods --json`"