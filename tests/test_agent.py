"""The VM agent with every outside thing faked (metadata server, container runtime, NVML, host),
on a clock 1000x faster than the wall."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from provisioner.abuse import Sample, judge
from provisioner.agent.agent import Agent, DoneIds
from provisioner.agent.config import AgentConfig
from provisioner.agent.fakes import FakeContainers, FakeHost, FakeMetadata, FakeNvml, mine
from provisioner.agent.gpu import Gpus
from provisioner.agent.usage import Connection, Usage
from provisioner.clock import RealClock
from provisioner.config_policy import AbuseConfig

HOME, SCRATCH = "/home/notebook", "/scratch"


class Rig:
    def __init__(self, tmp_path, **cfg):
        self.clock = RealClock(1000.0)
        self.cfg = AgentConfig(state_dir=tmp_path, health_s=10.0, progress_s=1.0, watch_timeout_s=60.0,
                               kill_grace_s=5.0, user_paths=(HOME, SCRATCH), disk_paths=("/", SCRATCH), **cfg)
        self.metadata = FakeMetadata(self.clock)
        self.host = FakeHost()
        self.host.d["dirs"].update({HOME: [], SCRATCH: []})
        self.host.d["disks"].update({"/": {"free_fraction": 0.6}, SCRATCH: {"free_fraction": 0.9}})
        self.containers = FakeContainers(self.clock, bytes_per_s=1e9)
        self.nvml = FakeNvml(self.host)
        self.task: asyncio.Task | None = None

    def agent(self) -> Agent:
        return Agent(self.cfg, self.metadata, self.containers, Gpus(self.nvml, reset=self.host.reset_gpus),
                     self.host, self.clock, DoneIds(self.cfg.state_dir / "done.json"))

    async def start(self) -> Agent:
        agent = self.agent()
        self.task = asyncio.create_task(agent.run())
        await until(lambda: self.metadata.guest.get("ready") == "1")
        return agent

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    def command(self, cid: str, op: str, **fields) -> None:
        self.metadata.set("provisioner-command", json.dumps({"id": cid, "op": op, **fields}))

    async def done(self, cid: str) -> str:
        await until(lambda: f"done-{cid}" in self.metadata.guest, what=f"done-{cid}")
        return self.metadata.guest[f"done-{cid}"]


async def until(check, timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        await asyncio.sleep(0.005)


LAYERS = [{"id": "os-v100", "bytes": 3_000_000_000}, {"id": "app-v101", "bytes": 500_000_000}]


async def test_a_pull_runs_once_reports_progress_and_survives_a_restart(tmp_path):
    rig = Rig(tmp_path)
    await rig.start()
    rig.command("c1", "pull", layers=LAYERS, bytes=3_500_000_000)
    assert await rig.done("c1") == "ok"
    await until(lambda: rig.metadata.guest.get("progress-c1") == "3500000000 0", what="the last progress")
    progress = [tuple(map(int, v.split())) for k, v in rig.metadata.writes if k == "progress-c1"]
    assert progress == sorted(progress, key=lambda p: p[0]) and len(progress) >= 3
    assert any(eta > 0 for _, eta in progress)  # an estimate on the way
    assert not rig.metadata.dropped
    assert rig.containers.state.data["layers"] == {"os-v100": 3_000_000_000, "app-v101": 500_000_000}
    await rig.stop()

    # A new agent process (same state dir) sees the same command: it reports, it does not rerun.
    rig.containers.state.data["layers"].clear()
    del rig.metadata.guest["done-c1"]
    await rig.start()
    assert await rig.done("c1") == "ok"
    assert rig.containers.state.data["layers"] == {}  # not pulled again
    await rig.stop()


async def test_it_waits_for_changes_instead_of_polling(tmp_path):
    rig = Rig(tmp_path)
    await rig.start()
    await asyncio.sleep(0.5)  # 500 model seconds with nothing to do
    assert rig.metadata.reads <= 500 / 60 + 2  # one held request per watch_timeout_s
    assert rig.metadata.value_reads <= 2 * (500 / 60 + 2)  # maintenance-event and preempted alike
    rig.command("c1", "wipe")
    assert await rig.done("c1") == "ok"
    await rig.stop()


async def test_a_new_command_supersedes_the_running_one(tmp_path):
    rig = Rig(tmp_path)
    rig.containers.bytes_per_s = 1e7  # 350 model seconds for this pull
    await rig.start()
    rig.command("c1", "pull", layers=LAYERS, bytes=3_500_000_000)
    await until(lambda: int(rig.metadata.guest.get("progress-c1", "0").split()[0]) > 0)
    rig.command("c2", "wipe")
    assert await rig.done("c1") == "error: superseded by command c2"
    assert await rig.done("c2") == "ok"
    rig.command("c3", "wipe")
    assert await rig.done("c3") == "ok"
    await until(lambda: "done-c1" not in rig.metadata.guest)  # older commands' attributes are cleaned up
    await rig.stop()


def session_leftovers(rig: Rig) -> None:
    rig.host.start_process(2001, 1001, "python3", gpu=True)
    rig.host.start_process(2002, 1001, "jupyter-lab")
    rig.host.start_process(1, 0, "systemd")  # not the user's
    rig.host.d["dirs"].update({HOME: ["model.ckpt", ".bashrc"], SCRATCH: ["data"], "/var/cache/images": ["os-v100"]})
    rig.host.state.save()
    rig.containers.run("nb-1", "provisioner-session=s-1")


async def test_a_wipe_ends_everything_of_the_session_keeps_the_cache_and_verifies(tmp_path):
    rig = Rig(tmp_path)
    await rig.start()
    rig.command("c0", "pull", layers=LAYERS[:1], bytes=3_000_000_000)
    assert await rig.done("c0") == "ok"
    session_leftovers(rig)
    rig.command("c1", "wipe")
    assert await rig.done("c1") == "ok"
    assert [p.name for p in rig.host.user_processes(0)] == ["systemd"]
    assert rig.host.entries(HOME) == [] and rig.host.entries(SCRATCH) == []
    assert rig.host.entries("/var/cache/images") == ["os-v100"]  # the image cache stays
    assert "os-v100" in rig.containers.state.data["layers"] and rig.containers.state.data["containers"] == {}
    assert rig.host.d["gpu_resets"] == 1
    await rig.stop()


async def test_a_wipe_that_cannot_be_verified_fails(tmp_path):
    rig = Rig(tmp_path)
    await rig.start()
    session_leftovers(rig)
    rig.host.start_process(4242, 1001, "miner", gpu=True, stubborn=True)  # survives SIGKILL (stuck in D state)
    rig.command("c1", "wipe")
    result = await rig.done("c1")
    assert result.startswith("error: the wipe could not be verified: processes left: miner (4242)")
    assert "GPU still used by miner" in result
    await rig.stop()

    rig = Rig(tmp_path / "ro")
    await rig.start()
    session_leftovers(rig)
    rig.host.d["disks"][SCRATCH]["read_only"] = True
    rig.command("c1", "wipe")
    assert (await rig.done("c1")).startswith("error: OSError: [Errno 30] Read-only file system")
    await rig.stop()


async def test_health_follows_the_thresholds_and_reports_gpu_use(tmp_path):
    rig = Rig(tmp_path)
    agent = await rig.start()
    assert rig.metadata.guest["healthy"] == "1" and rig.metadata.guest["health-detail"] == ""
    rig.host.start_process(2001, 1001, "python3", gpu=True)
    gpu = rig.nvml.state.data["gpus"][0]
    gpu.update(temperature_c=90, throttle=0x40 | 0x1, utilization=97, ecc_supported=False)
    assert await agent.check_health() == ["GPU 0 at 90 C (limit 85 C); throttling: hw_thermal_slowdown"]
    assert rig.metadata.guest["healthy"] == "0"
    assert rig.metadata.guest["health-detail"] == "GPU 0 at 90 C (limit 85 C); throttling: hw_thermal_slowdown"
    # Usage refreshes a report: it is written when the VM's write rate has room to spare.
    await until(lambda: Usage.from_json(rig.metadata.guest["usage"]) == Usage((97,), ("python3",), ("python3",)))

    gpu.update(temperature_c=60, throttle=0)
    assert await agent.check_health() == [] and rig.metadata.guest["healthy"] == "1"
    gpu["xids"].append(13)  # a user program's fault: not the GPU's
    assert await agent.check_health() == []
    gpu["xids"].append(79)  # fallen off the bus: stays, though the event is read once
    assert await agent.check_health() == ["GPU 0: XID 79"]
    assert await agent.check_health() == ["GPU 0: XID 79"]

    rig2 = Rig(tmp_path / "disk")
    agent2 = await rig2.start()
    rig2.host.d["disks"]["/"]["read_only"] = True
    rig2.host.d["disks"][SCRATCH]["free_fraction"] = 0.01
    assert await agent2.check_health() == ["the file system of / is read-only", "the disk of /scratch is full (1.0% free)"]
    await rig.stop()
    await rig2.stop()


async def test_usage_reports_the_session_processes_and_their_connections(tmp_path):
    rig = Rig(tmp_path)
    await rig.start()
    assert Usage.from_json(rig.metadata.guest["usage"]) == Usage((0,))  # no session yet
    pool = Connection("1.2.3.4", 3333)
    rig.host.start_process(3001, 1001, "jupyter-lab", connections=(Connection("10.0.0.2", 443),))
    rig.host.start_process(3002, 1001, "xmrig", gpu=True, connections=(pool,))
    rig.host.start_process(77, 0, "sshd", connections=(Connection("5.6.7.8", 22),))  # not the session's
    rig.nvml.state.data["gpus"][0]["utilization"] = 100
    await until(lambda: "xmrig" in rig.metadata.guest["usage"], what="the next health round")
    assert Usage.from_json(rig.metadata.guest["usage"]) == Usage(
        (100,), ("xmrig",), ("jupyter-lab", "xmrig"), (pool, Connection("10.0.0.2", 443)))
    await rig.stop()


async def test_a_seeded_miner_in_the_fakes_is_reported_and_flagged(tmp_path):
    rig = Rig(tmp_path)
    await rig.start()
    rig.host.start_process(3001, 1001, "python3", gpu=True)
    m = mine(rig.host, rig.nvml, seed=4)
    await until(lambda: m.name in rig.metadata.guest["usage"], what="the next health round")
    samples = []
    for minute in range(3):  # what the cluster reads, once a minute
        samples.append(Sample(60.0 * minute, Usage.from_json(rig.metadata.guest["usage"])))
        await rig.clock.sleep(60.0)
    assert samples[-1].usage == Usage((100,), ("python3", m.name), ("python3", m.name), (m.pool,))
    verdict = judge(samples, [], "batch", AbuseConfig())
    assert [(f.rule, f.process, f.connection) for f in verdict.findings] == [
        ("miner_program", m.name, None), ("pool_connection", "", m.pool)]
    await rig.stop()


async def test_the_health_sample_comes_on_its_own(tmp_path):
    rig = Rig(tmp_path)
    await rig.start()
    rig.nvml.state.data["gpus"][0]["temperature_c"] = 95
    await until(lambda: rig.metadata.guest.get("healthy") == "0", what="the next health round")
    assert rig.metadata.guest["health-detail"].startswith("GPU 0 at 95 C")
    await rig.stop()


async def test_without_a_gpu_driver_the_real_nvml_makes_the_vm_unhealthy(tmp_path):
    """The real nvidia-ml-py module on this machine (no NVIDIA driver): an unusable GPU is a fault."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    rig = Rig(tmp_path)
    rig.nvml = pynvml
    agent = await rig.start()
    assert rig.metadata.guest["healthy"] == "0"
    assert rig.metadata.guest["health-detail"].startswith("NVML: ")
    assert await agent.check_health() == [rig.metadata.guest["health-detail"]]
    await rig.stop()
