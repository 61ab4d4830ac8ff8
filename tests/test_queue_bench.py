"""`python -m provisioner.perf.queue` runs its three phases on a small burst and reports what the
core did: one record changed per stop at the head, the places behind it moved, the rest failing in
one step."""

from __future__ import annotations

from provisioner.perf import queue


def test_the_queue_benchmark_reports_each_phase(capsys):
    assert queue.main(["--creates", "300", "--users", "20"]) == 0
    out = capsys.readouterr().out
    creates, stops, expiry = out.strip().split("\n\n")
    assert creates.splitlines()[-1].split()[0] == "299"  # one session holds the pool's VM
    *_, last_stops = stops.splitlines()
    left, _ms, moved, records = last_stops.split()
    assert (int(left), float(records)) == (149, 1.0) and float(moved) > 100
    assert expiry.startswith("the other 149 time out together")
