"""The cluster core's part in the weekly GPU budget (decide/budgets.py): warnings ahead of the end
the front set, each once, a stop at the end, and an end that moves or goes away."""

from __future__ import annotations

from core_driver import Driver, make_core

from provisioner.decide import events as ev
from provisioner.model.states import SessionState as S
from provisioner.model.records import SessionKind

MIN = 60.0


def running() -> tuple[Driver, object]:
    d = Driver(make_core())
    d.add_warm(d.core.catalog.latest)
    s = d.allocate("spender", kind=SessionKind.BATCH)  # no idle cull while nobody touches it
    d.started(s)
    return d, s


def test_warned_thirty_and_five_minutes_ahead_then_stopped_at_the_end():
    d, s = running()
    end = d.now + 40 * MIN
    d.send(ev.BudgetSet(d.now, s.id, end))
    d.run_until(lambda: s.state is not S.RUNNING, 60 * MIN)
    assert s.state is S.STOPPING and "budget is used up" in s.reason
    assert end <= d.now <= end + d.core.config.tick_s
    assert [round((end - n.time) / MIN) for n in s.notices] == [30, 5]
    assert all(n.action_time == end and n.kind == "gpu_budget" for n in s.notices)


def test_an_end_already_near_warns_at_once_and_a_repeat_changes_nothing():
    d, s = running()
    end = d.now + 10 * MIN  # inside the 30-minute warning already
    d.send(ev.BudgetSet(d.now, s.id, end))
    d.advance(d.core.config.tick_s)
    assert len(s.notices) == 1 and "10 minutes" in s.notices[0].message
    revision = s.revision
    d.send(ev.BudgetSet(d.now, s.id, end))  # the next sweep says the same
    assert s.revision == revision
    d.run_until(lambda: s.state is not S.RUNNING, 20 * MIN)
    assert len(s.notices) == 2  # and the 5-minute one


def test_an_end_moved_later_or_cleared_is_not_acted_on_at_the_old_time():
    d, s = running()
    d.send(ev.BudgetSet(d.now, s.id, d.now + 20 * MIN))
    d.advance(10 * MIN)
    d.send(ev.BudgetSet(d.now, s.id, d.now + 60 * MIN))  # the user's other session ended
    d.advance(20 * MIN)
    assert s.state is S.RUNNING
    d.send(ev.BudgetSet(d.now, s.id, 0.0))  # nothing runs it out any more
    d.advance(60 * MIN)
    assert s.state is S.RUNNING
    assert [round((n.action_time - n.time) / MIN) for n in s.notices] == [20]  # the first end's warning only
