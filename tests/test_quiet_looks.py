"""A look at a pool whose VMs and queue did not change since the last, which asked for nothing, is
answered from the last (decide/sizing.py: _same_as_last_look): the pool must then be scaled exactly
as if every look were made in full, time-driven scale-downs and standby deletions included."""

from __future__ import annotations

import pytest
from core_driver import Driver, busy, make_core

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
