"""The cluster core's part in abuse detection (provisioner/decide/abuse_watch.py), driven through
`handle` by the tests' driver: reports judged as they come, a flag kept on the session and acted
on, the memory it takes bounded."""

from __future__ import annotations

import json

from provisioner.agent.simulated import miner
from provisioner.agent.usage import Connection, Usage
from provisioner.cloud.base import HealthReport
from provisioner.decide import events as ev
from provisioner.decide.abuse_watch import MAX_SAMPLES
from provisioner.decide.core import ClusterCore
from provisioner.model.states import SessionState as S
from provisioner.model.records import Session, SessionKind

from core_driver import Driver, make_core

MIN = 60.0
MINER = miner(3).usage()
TRAINING = Usage((100,), ("python3.11",), ("bash", "jupyter-lab", "python3.11"), ())
POOL = Connection("45.1.2.3", 3333)
RENAMED = Usage((100,), ("python",), ("python",), (POOL,))  # a miner called python, on a pool port


def running(d: Driver, kind: SessionKind = SessionKind.INTERACTIVE, user: str = "mal") -> Session:
    d.add_warm(d.core.catalog.latest)
    s = d.allocate(user=user, kind=kind)
    d.started(s)
    return s


def report(d: Driver, s: Session, usage: Usage, minutes: int, touch_every: int = 0) -> None:
    """The session's VM reports `usage` once a minute for `minutes` (the live cluster's health
    pass), touched every `touch_every` minutes; stops early once the session has left running."""
    for i in range(minutes):
        if s.state is not S.RUNNING:
            return
        if touch_every and i and i % touch_every == 0:
            d.touch(s)
        d.health(s.vm_id, usage=usage)
        d.advance(MIN)


def test_a_miner_is_flagged_at_its_first_report_stopped_with_the_rules_and_judged_no_more():
    d = Driver(make_core())
    s = running(d)
    d.health(s.vm_id, usage=Usage((3,), (), ("bash", "jupyter-lab"), ()))  # an idle notebook: nothing
    assert s.abuse is None and s.state is S.RUNNING
    d.advance(MIN)
    flagged_at = d.now
    step = d.send(ev.HealthReported(d.now, s.vm_id, _healthy(MINER)))
    assert s in step.sessions  # written with the step, with its stop
    assert s.state is S.STOPPING and s.reason == "stopped for abuse: miner_program"
    record = s.abuse
    assert (record.session_id, record.user_id, record.at, record.rules, record.dry_run) == \
        (s.id, "mal", flagged_at, ("miner_program",), False)
    assert json.loads(record.evidence)["findings"][0]["process"] == miner(3).name
    assert d.core.abuse_watch.watching(s.id) is None
    d.run_until(lambda: s.terminal, 10 * MIN)
    assert s.state is S.STOPPED and s.abuse is record


def test_a_renamed_miner_is_flagged_by_its_pool_connection_after_two_minutes():
    d = Driver(make_core())
    s = running(d)
    start = d.now
    report(d, s, RENAMED, 10)
    assert s.abuse is not None and s.abuse.rules == ("pool_connection",)
    assert s.abuse.at == start + 2 * MIN  # three reports a minute apart span pool_connection_min_s
    assert s.reason == "stopped for abuse: pool_connection"


def test_a_touched_notebook_at_full_gpu_is_not_flagged_and_an_untouched_one_is():
    d = Driver(make_core())
    touched, alone = running(d, user="ann"), running(d, user="mal")
    for i in range(120):  # two hours, reported every minute; ann's notebook is touched every 30
        if i and i % 30 == 0:
            d.touch(touched)
        for s in (touched, alone):
            if s.state is S.RUNNING:
                d.health(s.vm_id, usage=TRAINING)
        d.advance(MIN)
    assert touched.state is S.RUNNING and touched.abuse is None
    assert alone.abuse.rules == ("busy_without_activity",)
    assert alone.abuse.at == alone.ready_at + 45 * MIN  # idle_busy_window_s
    assert alone.state is not S.RUNNING and "busy_without_activity" in alone.reason


def test_a_training_batch_at_full_gpu_runs_past_the_window_and_an_unknown_program_does_not():
    d = Driver(make_core())
    batch = running(d, SessionKind.BATCH, user="ann")
    report(d, batch, TRAINING, 90)  # 90 minutes, past batch_busy_window_s (an hour)
    assert batch.state is S.RUNNING and batch.abuse is None
    other = running(d, SessionKind.BATCH, user="mal")
    report(d, other, Usage((100,), ("hashcat",), ("hashcat",), ()), 90)
    assert other.abuse.rules == ("unknown_gpu_program",) and other.state is not S.RUNNING


def test_a_dry_run_records_the_flag_and_stops_nothing():
    d = Driver(make_core(abuse={"dry_run": True}))
    s = running(d)
    report(d, s, MINER, 1)
    record = s.abuse
    assert record is not None and record.dry_run and s.state is S.RUNNING
    revision = s.revision
    report(d, s, MINER, 5)  # judged no more: nothing new to write
    assert s.abuse is record and s.revision == revision and s.state is S.RUNNING


def test_the_flag_survives_the_store_and_a_restore_and_older_records_load():
    d = Driver(make_core(abuse={"dry_run": True}))
    s = running(d)
    report(d, s, MINER, 1)
    body = s.to_dict()
    again = Session.from_dict(json.loads(json.dumps(body)))
    assert again.abuse == s.abuse
    older = {k: v for k, v in body.items() if k != "abuse"}  # written before the field existed
    assert Session.from_dict(older).abuse is None
    # A restarted core knows it was flagged, and does not judge it again.
    core = make_core(abuse={"dry_run": True})
    vm = d.core.vms[s.vm_id]
    core.handle(ev.Restored(d.now, (again,), (vm,)))
    step = core.handle(ev.HealthReported(d.now + MIN, vm.id, _healthy(MINER)))
    assert step.sessions == [] and core.sessions[s.id].abuse == s.abuse


def test_what_a_session_keeps_is_bounded_by_time_and_count_and_let_go_when_it_stops():
    d = Driver(make_core(abuse={"pool_connection_min_s": 0}))
    core: ClusterCore = d.core
    s = running(d)
    horizon = core.abuse_watch.horizon_s()
    assert horizon == 3600 + 300
    quiet = Usage((0,), (), ("bash",), ())
    for _ in range(3 * int(horizon / MIN)):  # three horizons of reports a minute apart, touched often
        d.touch(s)
        d.touch(s)
        d.health(s.vm_id, usage=quiet)
        d.advance(MIN)
    kept = core.abuse_watch.watching(s.id)
    assert kept.samples[-1].at - kept.samples[0].at <= horizon
    assert len(kept.touches) <= len(kept.samples) < 70
    for _ in range(2 * MAX_SAMPLES):  # an agent reporting every second
        d.health(s.vm_id, usage=quiet)
        d.advance(1)
    assert len(core.abuse_watch.watching(s.id).samples) == MAX_SAMPLES
    d.stop(s)
    assert core.abuse_watch.watching(s.id) is None


def test_touches_between_the_same_two_reports_break_a_run_once():
    """Kept touches are coalesced; the verdict is the one every touch would give."""
    d = Driver(make_core())
    s = running(d)
    for minute in range(50):
        if minute == 20:
            for _ in range(10):
                d.touch(s)
                d.advance(1)
        d.health(s.vm_id, usage=TRAINING)
        d.advance(MIN - (10 if minute == 20 else 0))
    # The run restarted after the touches, 29 minutes ago: under the 45-minute window.
    assert s.abuse is None and len(d.core.abuse_watch.watching(s.id).touches) == 1


def _healthy(usage: Usage) -> HealthReport:
    return HealthReport(True, usage=usage)
