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


def test_the_watchers_benchmark_reports_fewer_moves_with_the_interval_than_without(capsys):
    from provisioner.perf import watchers

    def reports(interval: str) -> int:
        assert watchers.main(["--queued", "60", "--departures", "20", "--per-s", "200", "--move-report-s", interval]) == 0
        line = capsys.readouterr().out.strip().splitlines()[-1]
        return int(line.split(": ")[1].split()[0])

    every_move, held = reports("0"), reports("0.5")
    assert every_move > 20 * 30  # each departure moved most of the sessions behind it
    assert 60 <= held < every_move / 4  # one report of the first move each, then the latest after the interval
