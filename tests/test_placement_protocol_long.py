"""The placement protocol's interleavings with one more switch between actors than
tests/test_placement_protocol.py allows, each schedule checked the same way. A file of its own so
that the suite's two workers can run it beside the short version."""

from __future__ import annotations

import pytest

from placement_explorer import SCENARIOS, explore


@pytest.mark.long
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_interleavings_with_one_more_preemption(scenario):
    schedules, complete, _, ends, _ = explore(scenario, limit=3_000, extra_preemptions=1)
    print(f"{scenario.name}: {schedules} schedules{'' if complete else ' (the first)'}, ends {dict(ends)}")
    assert schedules > 30  # each checked by check()
