"""The history benchmark in its smallest form: it fills a store, times both statements and says
what it filled. What the timings are is its output, not a test's business."""

from __future__ import annotations

import json
import subprocess
import sys


def test_history_benchmark_times_the_prune_and_the_admission_read():
    out = subprocess.run([sys.executable, "-m", "provisioner.perf.history", "--attempts", "500", "--requests", "50",
                          "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    assert (r["attempts"], r["requests"], r["live"]) == (500, 50, 10)  # the live ones, none of the ended
    assert r["prune_ms"] > 0 and r["admission_ms"] > 0
    assert "filling: 500 attempts" in out.stderr  # progress while it runs
