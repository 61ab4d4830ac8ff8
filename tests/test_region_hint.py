"""A create whose region hint was not followed says so: in the response (placement_note, in the
CLI's JSON) and on the CLI's stderr; a followed hint says nothing."""

from __future__ import annotations

import asyncio
import json

from provisioner import cli
from provisioner.front.router import ClusterView, PoolView, hint_note, rank
from provisioner.v1 import admin_service_pb2 as admin_pb


def _pool(warm_image: int = 0, warm: int = 0) -> PoolView:
    return PoolView(warm_by_image={"gpu:v1": warm_image} if warm_image else {}, warm=warm, booting=0,
                    assigned=0, queued=0, max_vms=8, cold_start_s=600.0)


def test_the_note_names_the_faster_start_that_outweighed_the_hint():
    views = [ClusterView("us-central1", "us-central1", True, False, {"gpu-p100": _pool()}),
             ClusterView("asia-east1", "asia-east1", True, False, {"gpu-p100": _pool(warm_image=1, warm=1)})]
    candidates = rank(views, "gpu-p100", "gpu:v1", "us-central1", False, 30.0)
    assert candidates[0].cluster == "asia-east1"
    note = hint_note(views, candidates, "us-central1", "asia-east1")
    assert note == ("placed in asia-east1, not in the hinted region us-central1: asia-east1 offered a warm VM "
                    "with the image (about 1 s, +30 s for another region), us-central1 only a new VM "
                    "(cold start) (about 600 s)")
    assert hint_note(views, candidates, "us-central1", "us-central1") == ""
    assert hint_note(views, candidates, "", "asia-east1") == ""
    # the hinted cluster ranked first but the session landed elsewhere: it was tried and failed
    first = rank(views[:1], "gpu-p100", "gpu:v1", "us-central1", False, 30.0) + candidates[:1]
    assert "us-central1 was tried first and could not take" in hint_note(views, first, "us-central1", "asia-east1")


async def test_the_cli_says_when_and_why_the_hinted_region_was_not_used(local_fleet, capsys):
    await local_fleet.admin.DrainCluster(admin_pb.DrainClusterRequest(cluster="us-central1"))
    base = ["--front", local_fleet.front_address, "--data-dir", str(local_fleet.data_dir)]
    create = ["session", "create", "--user", "ada", "--accelerator", "gpu-p100", "--image", "gpu:latest"]
    assert await asyncio.to_thread(cli.main, [*create, "--region", "us-central1", "--json", *base]) == 0
    out, err = capsys.readouterr()
    made = json.loads(out)
    assert made["cluster"] != "us-central1"
    note = f"placed in {made['cluster']}, not in the hinted region us-central1: it is draining"
    assert made["placement_note"] == note
    assert f"note: {note}" in err

    # a hint followed (here because it must be) adds nothing
    assert await asyncio.to_thread(cli.main, [*create, "--region", "asia-east1", "--require-region", "--json",
                                              *base]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["cluster"] == "asia-east1" and "placement_note" not in json.loads(out)
    assert "note:" not in err
