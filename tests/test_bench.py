"""The autoscaler benchmark: every policy's best setting on each trace, as a Markdown table."""

from __future__ import annotations

from provisioner.sim import bench
from provisioner.sim.trace import HEADER

ROWS = [f"{i * 400 + 7},u{i % 5},interactive,gpu-p100,gpu:v{158 + i % 3},us-central1,{600 + 90 * i},{i % 4 == 0:d}"
        for i in range(12)]


def test_table_has_a_row_per_policy_and_trace_with_its_command(tmp_path, capsys):
    for name in (bench.TUNED_ON, "other-sessions.csv"):
        (tmp_path / name).write_text("\n".join([",".join(HEADER), *ROWS]) + "\n")
    out = tmp_path / "table.md"
    assert bench.main(["--scales", "1", "--held-out-scale", "1", "--jobs", "1", "--traces", str(tmp_path),
                       "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines == capsys.readouterr().out.splitlines()
    rows = [line.split(" | ") for line in lines[2:]]
    assert [(r[0].lstrip("| "), r[2]) for r in rows] == [
        (f"{bench.TUNED_ON} (tuned on)", "fixed"), (f"{bench.TUNED_ON} (tuned on)", "headroom"),
        (f"{bench.TUNED_ON} (tuned on)", "predictive"), ("other-sessions.csv", "headroom"),
        ("other-sessions.csv", "predictive")]
    assert all(r[-1].startswith("`provisioner simulate --trace ") for r in rows)
    assert "--policy fixed --warm-vms " in rows[0][-1] and "--policy headroom --headroom " in rows[1][-1]


def test_best_is_the_cheapest_run_that_meets_the_target_else_the_fastest():
    fast_dear = ("a", {"fast_start_ratio": 0.999, "cost_usd": 50})
    fast_cheap = ("b", {"fast_start_ratio": 0.996, "cost_usd": 20})
    slow = ("c", {"fast_start_ratio": 0.9, "cost_usd": 5})
    assert bench.best([fast_dear, fast_cheap, slow])[0] == "b"
    assert bench.best([slow, ("d", {"fast_start_ratio": 0.95, "cost_usd": 9})])[0] == "d"


def test_missing_tuned_on_trace_is_an_error(tmp_path, capsys):
    assert bench.main(["--traces", str(tmp_path)]) == 1
    assert bench.TUNED_ON in capsys.readouterr().err
