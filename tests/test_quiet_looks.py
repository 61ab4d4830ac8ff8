"""A look at a pool whose VMs and queue did not change since the last, which asked for nothing, is
answered from the last (decide/sizing.py: _same_as_last_look): the pool must then be scaled exactly
as if every look were made in full, time-driven scale-downs and standby deletions included."""

from __future__ import annotations

import pytest
from core_driver import Driver, busy, make_core

from provisioner.decide import events as ev
from provisioner.decide.core import ClusterCore
from provisioner.decide.eventlog import replay
from provisioner.decide.sizing import Sizing

_SAME = Sizing._same_as_last_look


def _run(monkeypatch: pytest.MonkeyPatch, full: bool, **pool) -> tuple[Driver, int]:
    """A busy hour and a quiet half day after it; the commands issued, and the looks answered
    from the last one."""
    answered = [0]

    def counted(self, *args) -> bool:
        result = False if full else _SAME(self, *args)
        answered[0] += result
        return result

    monkeypatch.setattr(Sizing, "_same_as_last_look", counted)
    d = Driver(make_core(**pool))
    busy(d)
    d.advance(12 * 3600)
    return d, answered[0]


@pytest.mark.parametrize("pool", [dict(autoscaler="predictive", standby=True, min_vms=0, max_vms=12),
                                  dict(autoscaler="headroom", min_vms=1, max_vms=8)])
def test_a_quiet_pool_scales_as_if_every_look_were_made_in_full(monkeypatch, pool):
    full, _ = _run(monkeypatch, True, **pool)
    answered, skipped = _run(monkeypatch, False, **pool)
    assert skipped > 100  # most looks of the quiet half day
    quiet = [(t, type(c).__name__, c.vm_id) for t, c in full.log if t > 4800]
    assert quiet  # time alone made it act (idle VMs let go, the peak windows emptied)
    assert [(t, type(c).__name__, c.vm_id) for t, c in answered.log] == \
        [(t, type(c).__name__, c.vm_id) for t, c in full.log]
    assert {i: v.to_dict() for i, v in answered.core.vms.items()} == {i: v.to_dict() for i, v in full.core.vms.items()}


@pytest.mark.parametrize("pool", [dict(autoscaler="predictive", standby=True, min_vms=0, max_vms=12),
                                  dict(autoscaler="predictive", min_vms=1, max_vms=8)])
def test_ticks_carried_out_quietly_change_nothing_a_handled_tick_would_not(monkeypatch, pool):
    """The engine hands in only the ticks ClusterCore.tick_quietly leaves: the same run with every
    tick handed in issues the same commands at the same times, and leaves the same forecasts, and
    so does the quiet run's event log replayed."""
    def run(quietly: bool) -> Driver:
        with monkeypatch.context() as m:
            if not quietly:
                m.setattr(ClusterCore, "tick_quietly", lambda self, now: False)
            d = Driver(make_core(**pool))
            busy(d)
            d.advance(12 * 3600)
        return d

    def state(core: ClusterCore) -> tuple:
        return ({i: v.to_dict() for i, v in core.vms.items()},
                [(p.scaled_at, p.forecast_at, p.forecast_warm, p.forecast_cover) for p in core.pools.values()])

    handed, quiet = run(False), run(True)
    assert [(t, type(c).__name__, c.vm_id) for t, c in quiet.log] == \
        [(t, type(c).__name__, c.vm_id) for t, c in handed.log]
    assert state(quiet.core) == state(handed.core)
    ticks = lambda d: sum(isinstance(e, ev.Tick) for e in d.core.event_log.events)  # noqa: E731
    assert ticks(quiet) == ticks(handed) > 12 * 3600 / 5  # each tick is logged, handed in or not
    fresh = make_core(**pool)  # and the quiet run's log replays to the same pools
    replay(quiet.core.event_log.events, fresh)
    assert state(fresh) == state(quiet.core)
