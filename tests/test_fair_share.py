"""Fair share under a flood: a per-user ceiling on a pool's VMs (max_vms_per_user). A user at the
ceiling queues; everyone else is served first, and the pool does not grow for the flood."""

from __future__ import annotations

from core_driver import Driver, make_core

from provisioner.decide.autoscale import queued_demand
from provisioner.decide.commands import Launch
from provisioner.model.states import SessionState as S

LATEST = "gpu:latest"


def test_queued_demand_counts_each_user_up_to_the_ceiling_less_what_they_hold():
    assert queued_demand({"flood": 50, "ann": 1}, {"flood": 2}, 4) == 2 + 1
    assert queued_demand({"flood": 50}, {"flood": 9}, 4) == 0
    assert queued_demand({"ann": 3, "bob": 2}, {}, 4) == 5


def test_a_flooder_holds_at_most_the_ceiling_and_the_others_run_at_once():
    d = Driver(make_core(max_vms=20, min_vms=0, headroom_fraction=0.0, max_vms_per_user=3))
    for _ in range(4):
        d.add_warm(d.core.catalog.latest)
    flood = [d.allocate("flooder") for _ in range(30)]
    launched = len(d.commands(Launch))
    others = [d.allocate(f"user-{i}") for i in range(5)]
    d.run_until(lambda: all(s.state is S.RUNNING for s in others), 3600)
    running = [s for s in flood if s.state is S.RUNNING]
    assert len(running) == 3  # a warm VM each, up to the ceiling; the others queue
    assert all(s.state is S.QUEUED for s in flood if s not in running)
    assert launched == 0  # the flood made the pool grow by nothing
    waiting = next(s for s in flood if s.state is S.QUEUED)
    assert "per-user ceiling of 3" in waiting.history[-1].reason
    # The pool holds the flooder's 3 and what the others needed: the 27 queued add nothing.
    assert len(d.core.pools[waiting.pool].vms) <= 3 + 5 + 1
    # One of the flooder's sessions ends: the next of theirs takes its VM.
    d.stop(running[0])
    d.run_until(lambda: sum(s.state is S.RUNNING for s in flood) == 3, 600)
    assert sum(s.state is S.QUEUED for s in flood) == 26
