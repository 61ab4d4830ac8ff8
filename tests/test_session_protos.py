"""A cluster answers each session with a proto made once per revision (cluster/session_protos.py):
through queueing, pulls with progress, starts, touches, budget notices and stops, what it answers
is what a fresh conversion of the session gives."""

from __future__ import annotations

from core_driver import Driver, make_core

from provisioner.api import convert
from provisioner.cluster.session_protos import SessionProtos
from provisioner.decide import events as ev
from provisioner.model.states import SessionState as S
from provisioner.model.records import SessionKind
from provisioner.v1 import types_pb2 as pb


def _answered(protos: SessionProtos, s, now: float, brief: bool = False) -> pb.Session:
    out = pb.Session()
    protos.fill(out, s, now, brief)
    return out


def _same_as_fresh(protos: SessionProtos, d: Driver) -> None:
    for s in d.sessions.values():
        for brief in (False, True):
            assert _answered(protos, s, d.now, brief) == convert.session_to_pb(s, d.now, brief), (s.id, s.state, brief)


def test_every_answer_equals_a_fresh_conversion_through_a_session_lifecycle():
    d = Driver(make_core(max_vms=3))
    protos = SessionProtos()
    d.checks.append(lambda drv: _same_as_fresh(protos, drv))
    d.add_warm(d.core.catalog.latest)
    batch = [d.allocate(f"user-{i}", kind=SessionKind.BATCH) for i in range(5)]  # a warm start, cold ones, a queue
    assert {S.STARTING, S.QUEUED} <= {s.state for s in batch}  # the warm start's notebook is starting
    seen = set()
    d.checks.append(lambda drv: seen.update(s.state for s in drv.sessions.values()))
    d.advance(60.0)
    d.touch(batch[0])
    d.send(ev.BudgetSet(d.now, batch[0].id, d.now + 10 * 60))  # inside the first warning
    d.advance(d.core.config.tick_s)
    assert batch[0].notices
    d.stop(batch[1], "done")
    d.advance(30 * 60.0)
    assert {S.PULLING_IMAGE, S.STARTING, S.RUNNING, S.STOPPING, S.STOPPED} <= seen
    assert any(s.pull_bytes_done for s in d.sessions.values())  # progress was answered on the way


def test_the_oldest_proto_made_goes_first_past_the_bound():
    d = Driver(make_core())
    d.add_warm(d.core.catalog.latest)
    a, b, c = (d.allocate(f"user-{i}") for i in range(3))
    protos = SessionProtos(max_kept=2)
    for s in (a, b, c):
        _answered(protos, s, d.now)
    assert list(protos._kept) == [(b.id, False), (c.id, False)]
    assert _answered(protos, a, d.now) == convert.session_to_pb(a, d.now)


def test_a_brief_proto_cut_from_the_whole_one_equals_a_fresh_brief_conversion():
    d = Driver(make_core())
    d.add_warm(d.core.catalog.latest)
    s = d.allocate("user-1")
    d.advance(d.core.config.tick_s)  # its notebook started: a budget is a running session's
    assert s.state is S.RUNNING
    d.send(ev.BudgetSet(d.now, s.id, d.now + 10 * 60))
    d.advance(d.core.config.tick_s)
    assert s.history and s.notices
    protos = SessionProtos()
    _answered(protos, s, d.now)  # answered whole first (an Allocate, a Get), then listed brief
    assert _answered(protos, s, d.now, brief=True) == convert.session_to_pb(s, d.now, brief=True)
