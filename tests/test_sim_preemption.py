"""The simulator replays priority and preemption with the cluster core's own code, and reports the
preemptions and the waits of interactive sessions."""

from __future__ import annotations

import json

from provisioner.cli import main
from provisioner.config import load_fleet
from provisioner.sim.policies import with_policy, with_priority
from provisioner.sim.replay import Replay
from provisioner.sim.trace import HEADER, read_trace

# A pool of two VMs in us-central1: ben's three day-long batches take both (the third waits), then
# dee's interactive session arrives at hour 1, and ben's last batch would end at hour 5.
ROWS = [
    "0,ben,batch,gpu-p100,gpu:latest,us-central1,86400,0",
    "60,ben,batch,gpu-p100,gpu:latest,us-central1,18000,0",
    "120,ben,batch,gpu-p100,gpu:latest,us-central1,86400,0",
    "3600,dee,interactive,gpu-p100,gpu:latest,us-central1,1800,0",
]


def trace(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("\n".join([",".join(HEADER), *ROWS]) + "\n")
    return path


def replay(tmp_path, share: int, requeue: bool = False) -> dict:
    fleet = with_priority(with_policy(load_fleet(), "fixed", warm_vms=2, max_vms=2), share, 120.0)
    r = Replay(fleet, read_trace(trace(tmp_path)), requeue=requeue)
    r.run()
    return r.results()


def test_with_a_share_the_interactive_session_preempts_an_over_share_batch(tmp_path):
    without = replay(tmp_path, share=0)
    assert without["preempted"] == 0
    # dee waits for ben's second batch to end at hour 5 (1800 s of trace left: it never runs).
    assert without["interactive"]["started"] == 0

    out = replay(tmp_path, share=1)
    assert out["preempted"] == 1 and out["requeued"] == 0
    assert out["interactive"]["started"] == 1
    wipe_s = load_fleet().cluster("us-central1").sim.wipe_s
    assert 120 <= out["interactive"]["wait_max_s"] <= 120 + wipe_s + 15  # the grace period, a wipe, ticks


def test_a_requeued_batch_runs_again_for_what_it_had_left(tmp_path):
    out = replay(tmp_path, share=1, requeue=True)
    assert out["preempted"] == 1 and out["requeued"] == 1 and out["requeued_started"] == 1
    assert out["sessions"] == len(ROWS)  # the requeued session is counted apart


def test_cli_reports_preemptions_and_interactive_waits(tmp_path, capsys):
    code = main(["simulate", "--trace", str(trace(tmp_path)), "--policy", "fixed", "--warm-vms", "2", "--max-vms", "2",
                 "--share-gpus", "1", "--grace", "120", "--requeue", "--jobs", "1", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["preempted"] == 1 and out["interactive"]["started"] == 1
    assert main(["simulate", "--trace", str(trace(tmp_path)), "--max-vms", "0"]) == 2
