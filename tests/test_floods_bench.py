"""The flood benchmark (python -m provisioner.perf.floods) runs end to end, short: every flood it
knows beside bob's creates, on both fleets, and a row for each with bob's creates and the new
clients measured."""

from __future__ import annotations

import json
import subprocess
import sys

from provisioner.perf.floods import FLEETS, FLOODS


def test_a_short_run_measures_bob_beside_every_flood():
    out = subprocess.run([sys.executable, "-m", "provisioner.perf.floods", "--seconds", "1", "--mallory-sessions", "5", "--ramps", "2",
                          "--warm-vms", "10",
                          "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads(out.stdout)
    assert results["command"].startswith("python -m provisioner.perf.floods --seconds 1")
    rows = results["rows"]
    assert [(r["fleet"], r["flood"]) for r in rows] == [(f, k) for f in FLEETS for k in ("quiet", *FLOODS)]
    assert all(r["creates"] >= 2 and r["p50_ms"] > 0 and r["fleet_cpu_s"] >= 0 and r["load"] >= 0 for r in rows)
    assert all(r["new_client"]["ms"] > 0 and r["new_client"]["create_ms"] > 0 and 0 <= r["slowest_at_s"] <= 1.0
               for r in rows)
    # The idle flood's rows start once the front holds its connections, with clients made during its ramps.
    for r in rows:
        if r["flood"] == "idle":
            assert len(r["ramps"]) == 2
            assert all(x["client"]["failed"] is None and x["client"]["ready_ms"] > 0 and x["client"]["create_ms"] > 0
                       and x["s"] > 0 for x in r["ramps"]), r["ramps"]  # a failure says why
        else:
            assert r["ramps"] is None
