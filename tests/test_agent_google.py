"""The agent as Compute Engine's metadata server has it: guest attribute writes beyond about 10 a
minute dropped, `maintenance-event` and `instance/preempted` told through the metadata server, and a
cluster that asks again when an answer was lost."""

from __future__ import annotations

import json

from provisioner.agent.fakes import FakeRuntime
from test_agent import Rig, until

GB = 1_000_000_000


async def test_a_long_pull_stays_within_the_write_rate_and_its_done_gets_through(tmp_path):
    rig = Rig(tmp_path)
    rig.runtime = FakeRuntime(rig.clock, rig.host, bytes_per_s=5e7)  # 30 GB: ten model minutes
    await rig.start()
    rig.command("c1", "pull", layers=[{"id": f"l{i}", "bytes": 3 * GB} for i in range(10)], bytes=30 * GB)
    assert await rig.done("c1") == "ok"
    assert not rig.metadata.dropped, f"{len(rig.metadata.dropped)} writes beyond the rate were dropped"
    progress = [v for k, v in rig.metadata.writes if k == "progress-c1"]
    assert len(progress) >= 10  # it kept reporting, about every 10 model seconds
    # A health report that changes still gets through while progress fills the rate.
    rig.nvml.state.data["gpus"][0].update(temperature_c=95)
    await until(lambda: rig.metadata.guest.get("healthy") == "0", what="unhealthy reported")
    assert not rig.metadata.dropped
    await rig.stop()


async def test_host_maintenance_and_a_spot_preemption_are_reported(tmp_path):
    rig = Rig(tmp_path)
    await rig.start()
    assert "maintenance" not in rig.metadata.guest and "preempted" not in rig.metadata.guest
    rig.metadata.set_value("instance/maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE")
    await until(lambda: rig.metadata.guest.get("maintenance") == "TERMINATE_ON_HOST_MAINTENANCE", what="maintenance")
    rig.metadata.set_value("instance/preempted", "TRUE")
    await until(lambda: rig.metadata.guest.get("preempted") == "TRUE", what="preempted")
    await rig.stop()


async def test_an_answer_lost_on_the_way_is_written_again_when_asked(tmp_path):
    rig = Rig(tmp_path)
    await rig.start()
    rig.command("c1", "wipe")
    assert await rig.done("c1") == "ok"
    del rig.metadata.guest["done-c1"]  # dropped on the way
    rig.metadata.set("provisioner-command", json.dumps({"id": "c1", "op": "wipe", "ask": 1}))
    assert await rig.done("c1") == "ok"
    assert [k for k, _ in rig.metadata.writes].count("done-c1") == 2
    await rig.stop()


async def test_a_command_still_at_work_says_so_when_asked_and_runs_once(tmp_path):
    rig = Rig(tmp_path)
    rig.runtime = FakeRuntime(rig.clock, rig.host, bytes_per_s=5e7)  # 3 GB: a model minute
    await rig.start()
    pull = {"id": "c1", "op": "pull", "layers": [{"id": "l0", "bytes": 3 * GB}], "bytes": 3 * GB}
    rig.command("c1", "pull", layers=pull["layers"], bytes=pull["bytes"])
    await until(lambda: "progress-c1" in rig.metadata.guest, what="the pull under way")
    rig.metadata.set("provisioner-command", json.dumps({**pull, "ask": 1}))
    await until(lambda: rig.metadata.guest.get("asked-c1") == "1", what="asked-c1")
    assert "done-c1" not in rig.metadata.guest
    assert await rig.done("c1") == "ok"
    assert [k for k, _ in rig.metadata.writes].count("done-c1") == 1
    rig.command("c2", "wipe")  # two commands on, the old one's attributes go
    assert await rig.done("c2") == "ok"
    rig.command("c3", "wipe")
    assert await rig.done("c3") == "ok"
    await until(lambda: "asked-c1" not in rig.metadata.guest, what="asked-c1 deleted")
    await rig.stop()


async def test_the_http_metadata_client_against_the_fake_server_as_google_answers(tmp_path):
    import asyncio

    from fake_compute import FakeCompute
    from fake_metadata import FakeMetadataServer
    from provisioner.agent.metadata import HttpMetadata

    compute = FakeCompute(agents="external").start()  # the guest attributes are this client's alone
    compute.plant("p", "us-central1-f", "vm", {})
    compute.instances[("p", "vm")].body["metadata"] = {"items": [{"key": "enable-guest-attributes", "value": "TRUE"}]}
    server = FakeMetadataServer(compute, "p", "vm").start()
    try:
        md = HttpMetadata(server.url)
        value, etag = await md.value("instance/maintenance-event", "", 5)
        assert value == "NONE" and etag
        waiting = asyncio.create_task(md.value("instance/maintenance-event", etag, 5))  # held until it changes
        await asyncio.sleep(0.2)
        assert not waiting.done()
        compute.announce_maintenance("p", "vm")
        assert (await waiting)[0] == "TERMINATE_ON_HOST_MAINTENANCE"
        assert (await md.value("instance/preempted", "", 5))[0] == "FALSE"
        # Writes beyond 10 a minute are answered as if kept, and dropped.
        for i in range(12):
            await md.put_guest(f"k{i}", "v")
        assert sorted(k for k in compute.instances[("p", "vm")].guest if k.startswith("k")) == sorted(
            f"k{i}" for i in range(10))
        assert server.dropped == [("PUT", "k10"), ("PUT", "k11")]
    finally:
        server.stop()
        compute.stop()
