"""The VM agent with every outside thing faked (metadata server, container runtime, NVML, host),
on a clock 1000x faster than the wall."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from provisioner.rules.abuse import Sample, judge
from provisioner.agent.agent import Agent, DoneIds
from provisioner.agent.config import AgentConfig
from provisioner.agent.fakes import FakeHost, FakeMetadata, FakeNvml, FakeRuntime
from provisioner.agent.simulated import mine
from provisioner.agent.gpu import Gpus
from provisioner.agent.runtime import Credentials
from provisioner.agent.usage import Connection, Usage
from provisioner.common.clock import RealClock
from provisioner.config.policy import AbuseConfig

WORKSPACES, SCRATCH = "/var/lib/provisioner-agent/workspaces", "/scratch"


class Rig:
    def __init__(self, tmp_path, **cfg):
        self.clock = RealClock(1000.0)
        self.cfg = AgentConfig(state_dir=tmp_path, health_s=10.0, progress_s=1.0, watch_timeout_s=60.0,
                               kill_grace_s=5.0, workspace_root=WORKSPACES, disk_paths=("/", SCRATCH), **cfg)
        self.metadata = FakeMetadata(self.clock)
        self.host = FakeHost()
        self.host.d["dirs"].update({WORKSPACES: [], SCRATCH: []})
        self.host.d["disks"].update({"/": {"free_fraction": 0.6}, SCRATCH: {"free_fraction": 0.9}})
        self.runtime = FakeRuntime(self.clock, self.host, bytes_per_s=1e9)
        self.nvml = FakeNvml(self.host)
        self.task: asyncio.Task | None = None

    def agent(self) -> Agent:
        return Agent(self.cfg, self.metadata, self.runtime, Gpus(self.nvml, reset=self.host.reset_gpus),
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
    assert rig.runtime.state.data["layers"] == {"os-v100": 3_000_000_000, "app-v101": 500_000_000}
    await rig.stop()

    # A new agent process (same state dir) sees the same command: it reports, it does not rerun.
    rig.runtime.state.data["layers"].clear()
    del rig.metadata.guest["done-c1"]
    await rig.start()
    assert await rig.done("c1") == "ok"
    assert rig.runtime.state.data["layers"] == {}  # not pulled again
    await rig.stop()


async def test_a_pull_logs_in_with_the_vms_token_or_the_configured_password(tmp_path):
    image = {"repository": "us-docker.pkg.dev/p/nb/gpu", "digest": "sha256:" + "cd" * 32, "layers": LAYERS[:1]}
    rig = Rig(tmp_path)  # registry_auth: metadata, the default
    await rig.start()
    rig.command("c1", "pull", **image)
    assert await rig.done("c1") == "ok"
    assert rig.runtime.logins == [Credentials("oauth2accesstoken", "fake-access-token")]
    await rig.stop()

    (tmp_path / "password").write_text("s3cret\n")
    rig = Rig(tmp_path / "basic", registry_auth="basic", registry_username="puller",
              registry_password_file=tmp_path / "password")
    await rig.start()
    rig.command("c1", "pull", **image)
    assert await rig.done("c1") == "ok"
    assert rig.runtime.logins == [Credentials("puller", "s3cret")]
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
    rig.runtime.bytes_per_s = 1e7  # 350 model seconds for this pull
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
    """A session's container (its processes, one on the GPU), its workspace, and things that are
    not the session's: the host's own processes, a process of a uid >= 1000 outside any container."""
    rig.runtime.run("nb-1", "s-1", pid=2001)
    rig.host.start_process(2001, 1000, "jupyter-lab", ns=2001)
    rig.host.start_process(2002, 1000, "python3", gpu=True, ns=2001)
    rig.host.start_process(1, 0, "systemd")
    rig.host.start_process(3001, 1001, "backup-daemon")  # the VM's own, not the session's
    rig.host.d["dirs"].update({WORKSPACES: ["s-1"], f"{WORKSPACES}/s-1": ["model.ckpt"],
                               "/var/cache/images": ["os-v100"]})
    rig.host.state.save()


async def test_a_wipe_ends_everything_of_the_session_keeps_the_cache_and_verifies(tmp_path):
    rig = Rig(tmp_path)
    await rig.start()
    rig.command("c0", "pull", layers=LAYERS[:1], bytes=3_000_000_000)
    assert await rig.done("c0") == "ok"
    session_leftovers(rig)
    rig.command("c1", "wipe")
    assert await rig.done("c1") == "ok"
    assert sorted(p.name for p in rig.host.user_processes(0)) == ["backup-daemon", "systemd"]  # not signalled
    assert rig.host.entries(WORKSPACES) == []
    assert rig.host.entries("/var/cache/images") == ["os-v100"]  # the image cache stays
    assert "os-v100" in rig.runtime.state.data["layers"] and rig.runtime.state.data["containers"] == {}
    # Reset once its own NVML handle was let go (the driver refuses a reset while one is open).
    assert rig.host.d["gpu_resets"] == 1 and rig.host.d["nvml_holders"] == 1
    await rig.stop()


async def test_a_wipe_that_cannot_be_verified_fails_and_resets_no_gpu_in_use(tmp_path):
    rig = Rig(tmp_path)
    await rig.start()
    session_leftovers(rig)
    rig.host.start_process(4242, 1000, "miner", gpu=True, stubborn=True, ns=2001)  # survives SIGKILL (D state)
    rig.command("c1", "wipe")
    result = await rig.done("c1")
    assert result.startswith("error: the wipe could not be verified: processes left: miner (4242)")
    assert "GPU reset skipped: still used by miner" in result and rig.host.d["gpu_resets"] == 0
    assert "backup-daemon" in [p.name for p in rig.host.user_processes(1000)]
    await rig.stop()

    rig = Rig(tmp_path / "ro")
    await rig.start()
    session_leftovers(rig)
    rig.host.d["disks"]["/"]["read_only"] = True
    rig.command("c1", "wipe")
    assert (await rig.done("c1")).startswith("error: OSError: [Errno 30] Read-only file system")
    await rig.stop()


async def test_a_session_starts_reports_its_port_and_stops(tmp_path):
    rig = Rig(tmp_path, publish_port=0)
    await rig.start()
    start = {"session_id": "s-7", "user": "ada", "cluster": "us-central1", "repository": "reg/nb",
             "digest": "sha256:" + "ab" * 32, "secret": "tok", "cpus": 4, "memory_bytes": 1 << 34}
    rig.command("c1", "start", **start)
    answer = await rig.done("c1")
    assert answer.startswith("ok ")
    port = int(answer.split()[1])
    [c] = await rig.runtime.session_containers()
    assert c.session_id == "s-7" and rig.runtime.state.data["containers"][c.id]["port"] == port
    assert rig.host.entries(WORKSPACES) == ["s-7"]
    rig.command("c2", "start", **start)  # the same session again: the same container
    assert await rig.done("c2") == f"ok {port}"
    assert len(await rig.runtime.session_containers()) == 1
    rig.command("c3", "stop", session_id="s-7")
    assert await rig.done("c3") == "ok"
    assert await rig.runtime.session_containers() == [] and rig.host.alive([c.pid]) == []

    rig.runtime.state.data["fail_start"] = "container exited 1: ModuleNotFoundError: jupyterlab"
    rig.command("c4", "start", **{**start, "session_id": "s-8"})
    assert await rig.done("c4") == "error: ContainerError: container exited 1: ModuleNotFoundError: jupyterlab"
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
