"""`provisioner admin ...` against fake servicers over real loopback gRPC."""

from __future__ import annotations

import json

import pytest

import cli_front
from provisioner.v1 import types_pb2

# The shared fixtures: a test takes them by naming them.
credentials, front, own_tracing_globals, run = (
    cli_front.credentials, cli_front.front, cli_front.own_tracing_globals, cli_front.run)


def test_set_policy_sends_only_given_fields(run, front):
    rc, out, err = run("admin", "set-policy", "--cluster", "us-central1", "--pool", "gpu-p100",
                       "--min", "2", "--no-recycle", "--json")
    assert rc == 0, err
    req = front.admin.requests[0]
    assert (req.cluster, req.pool) == ("us-central1", "gpu-p100")
    p = req.policy
    assert p.HasField("min_vms") and p.min_vms == 2
    assert p.HasField("recycle") and p.recycle is False
    assert not p.HasField("max_vms")
    assert not p.HasField("headroom_fraction")
    assert not p.HasField("autoscaler")
    assert json.loads(out)["policy"] == {"min_vms": 2, "max_vms": None, "headroom_fraction": None,
                                         "autoscaler": None, "recycle": False}


def test_set_policy_needs_a_field(run, front):
    rc, _, err = run("admin", "set-policy", "--cluster", "c", "--pool", "p")
    assert rc == 2 and "nothing to set" in err
    assert front.admin.requests == []


@pytest.mark.parametrize("argv, key", [
    (["clusters"], "clusters"),
    (["pools", "--cluster", "us-central1"], "pools"),
    (["drain", "us-central1"], "draining"),
    (["undrain", "us-central1"], "draining"),
    (["prewarm", "--cluster", "c", "--pool", "p", "--image", "gpu:v155", "--count", "2"], "vm_ids"),
    (["vms", "--state", "warm", "booting"], "vms"),
    (["evict", "--cluster", "c", "vm-1", "--reason", "bad gpu"], "state"),
])
def test_admin_commands(run, front, argv, key):
    rc, out, err = run("admin", *argv, "--json")
    assert rc == 0, err
    assert key in json.loads(out)
    rc, out, err = run("admin", *argv)
    assert rc == 0 and out.strip()


def test_admin_requests(run, front):
    run("admin", "vms", "--cluster", "c", "--state", "warm", "--state", "booting")
    run("admin", "evict", "--cluster", "c", "vm-1", "--reason", "bad gpu")
    run("admin", "prewarm", "--cluster", "c", "--pool", "p", "--image", "gpu:v155")
    vms, evict, prewarm = front.admin.requests
    assert list(vms.states) == [types_pb2.VM_STATE_WARM, types_pb2.VM_STATE_BOOTING]
    assert (evict.cluster, evict.vm_id, evict.reason) == ("c", "vm-1", "bad gpu")
    assert prewarm.count == 1


def test_admin_tables(run):
    _, out, _ = run("admin", "clusters")
    assert out.splitlines()[1].split() == ["us-central1", "us-central1", "10.0.0.1:50052", "yes",
                                           "no", "1"]
    _, out, _ = run("admin", "drain", "us-central1")
    assert "draining: yes" in out


def test_headroom_without_the_headroom_autoscaler_warns(run):
    rc, _, err = run("admin", "set-policy", "--cluster", "us-central1", "--pool", "gpu-p100", "--headroom", "0.3")
    assert rc == 0 and "warning: headroom is kept but has no effect" in err
    rc, _, err = run("admin", "set-policy", "--cluster", "us-central1", "--pool", "gpu-p100",
                     "--autoscaler", "headroom", "--headroom", "0.3")
    assert rc == 0 and "warning" not in err
