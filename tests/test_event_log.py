"""The event log replays an incident exactly: the same events into a fresh core give the same state."""

from __future__ import annotations

from core_driver import Driver, busy, make_core

from provisioner.decide import events as ev
from provisioner.decide.eventlog import EventLog, replay


def state(core) -> dict:
    return {"sessions": {i: s.to_dict() for i, s in core.sessions.items()},
            "vms": {i: v.to_dict() for i, v in core.vms.items()},
            "in_flight": core.in_flight(), "queues": {n: list(p.queue) for n, p in core.pools.items()},
            "ranking": {n: p.ranking for n, p in core.pools.items()}}


def test_a_recorded_log_replayed_into_a_fresh_core_gives_the_same_state():
    d = Driver(make_core(min_vms=2, max_vms=6))
    d.fail_pulls = True  # failures and their answers are events like any other
    busy(d)
    d.advance(900)
    log = d.core.event_log
    assert any(isinstance(e, ev.CommandFailed) for e in log.events) and any(isinstance(e, ev.Restored) for e in log.events)

    fresh = make_core(min_vms=2, max_vms=6)  # same seed: the same ids
    replay(log.events, fresh)
    assert state(fresh) == state(d.core)
    assert len(fresh.event_log.events) == len(log.events)


def test_the_log_keeps_only_its_window():
    log = EventLog(keep_s=100.0)
    for t in range(0, 1000, 10):
        log.record(ev.Tick(float(t)))
    assert [e.at for e in log.events] == [float(t) for t in range(890, 1000, 10)]
