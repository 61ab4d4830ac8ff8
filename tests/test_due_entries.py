"""A deadline that can no longer fall due wakes no tick.

At every tick the cluster core asks its parts whether anything is due (ClusterCore.tick_quietly),
and a shell may leave out a tick with nothing due (the replay engine does). A command answered
since, or a session that no longer runs or was touched since, leaves an entry behind in its
part's heap of deadlines; the part passes over such entries when asked, as its own pass would,
so they wake nothing.
"""

from __future__ import annotations

from core_driver import Driver, make_core

from provisioner.decide.commands import Wipe
from provisioner.decide.culling import cull_at
from provisioner.decide.in_flight import InFlight


def test_an_answered_command_s_deadline_wakes_nothing():
    flight = InFlight(make_core().config)
    answered = flight.issue(Wipe, 0.0, "vm-a", "zone-a")
    waiting = flight.issue(Wipe, 10.0, "vm-b", "zone-a")
    limit = flight.limit_s(answered)
    flight.settle(answered)
    assert not flight.due(limit)  # only the answered command's deadline has passed
    assert flight.due(10.0 + limit)
    assert flight.next_expired(10.0 + limit) is waiting


def test_a_session_stopped_or_touched_since_wakes_no_cull():
    d = Driver(make_core())
    d.add_warm("gpu:v160")
    d.add_warm("gpu:v160")
    a, b = d.allocate(user="a", image="gpu:v160"), d.allocate(user="b", image="gpu:v160")
    d.started(a, b)
    d.advance(60)
    was_due = max(cull_at(a), cull_at(b))
    d.stop(a)
    d.touch(b)  # its idle deadline moves an hour on from now
    culling = d.core.culling
    assert not culling.due(was_due)
    assert cull_at(b) > was_due and culling.due(cull_at(b))
