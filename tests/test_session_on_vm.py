"""A session that really runs: the cluster on the gce backend (the real google-cloud-compute
client) against the fake Compute Engine, its catalog read from a real registry (docker-registry,
TLS, htpasswd) holding three versions of the notebook stand-in built here, and a real agent
process on the VM whose container engine is podman serving the Docker Engine API. Only the GPU
is a fake (there is none here). The pool has one VM, so the one engine is that VM's alone."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from conftest import fleet_config
from fake_compute import FakeCompute
from oci import TOKEN_ENV, build_image, push_image, push_versions, require_tools, start_registry
from live_records import follow
from podman import skip_or_fail, start_podman
from provisioner.common.clock import RealClock
from provisioner.cloud.gce import GceBackend
from provisioner.cluster.runtime import ClusterRuntime
from provisioner.decide.core import ClusterCore
from provisioner.decide.ids import IdSource
from provisioner.model.errors import NotFound
from provisioner.model.records import SessionSpec
from provisioner.registry.catalog import RegistryCatalog
from provisioner.registry.client import RegistryClient
from test_agent_e2e import CLUSTER, POOL, PROJECT, TIME_SCALE, Agents, until
from test_engine import get
from gce_fixtures import loopback_only  # noqa: F401 (a fixture)

# A registry, an engine, a VM booting and three image pushes: minutes on a loaded machine.
pytestmark = pytest.mark.timeout(600)


@pytest.fixture
async def rig(tmp_path, loopback_only):  # noqa: F811
    require_tools()
    registry = start_registry(tmp_path / "registry")
    try:
        engine = start_podman({"SSL_CERT_FILE": str(registry.ca_file)})
    except RuntimeError as err:
        registry.stop()
        skip_or_fail(str(err))
    images = push_versions(registry)
    client = RegistryClient(registry.url, ca_file=str(registry.ca_file),
                            credentials=lambda: (registry.username, registry.password))
    source = RegistryCatalog(client, "nb")
    fake = FakeCompute(boot_s=0.1, op_s=0.02, agents="external").start()

    def edit(cluster: dict) -> None:
        cluster["backend"] = {"kind": "gce", "project": PROJECT, "endpoint": fake.endpoint, "poll_s": 1.0,
                              "agent_package": "preinstalled", "retry_total_s": 10.0}
        for pool in cluster["pools"]:
            if pool["name"] == POOL:
                pool.update(min_vms=1, max_vms=1, autoscaler="fixed", warm_vms=1, disk_cache_gb=30,
                            notebook_cpus=0.5, notebook_memory_gb=0.25)
            else:
                pool.update(min_vms=0, max_vms=0)
    config = fleet_config(tmp_path, edit)
    cfg = config.cluster(CLUSTER)
    clock = RealClock(TIME_SCALE)
    runtime = ClusterRuntime(ClusterCore(cfg, source.fetch(), config.settings.sessions, IdSource(CLUSTER)),
                             GceBackend(cfg, clock), clock)
    (tmp_path / "registry-password").write_text(registry.password)
    agents = Agents(fake, tmp_path / "vms", settings={
        "engine_url": engine.url, "registry_auth": "basic", "registry_username": registry.username,
        "registry_password_file": str(tmp_path / "registry-password"), "publish_ip": "127.0.0.1",
        "publish_port": 0, "workspace_root": str(tmp_path / "workspaces"), "disk_paths": ["/"]},
        flags=lambda d: ["--simulate-gpus", str(d / "gpu")])
    watcher = asyncio.create_task(agents.run())
    await runtime.start()
    try:
        yield registry, engine, images, source, fake, runtime, agents, tmp_path / "workspaces"
    finally:
        await runtime.close()
        watcher.cancel()
        agents.close()
        fake.stop()
        engine.stop()
        registry.stop()


def containers(engine, *filters: str) -> list[dict]:
    return json.loads(engine.cli("ps", "--all", "--format", "json", *[f"--filter={f}" for f in filters]) or "[]")


async def test_a_session_runs_its_pinned_digest_behind_its_secret_and_the_wipe_leaves_nothing_of_it(rig):
    registry, engine, images, source, fake, runtime, agents, workspaces = rig
    core = runtime.core
    assert core.catalog.versions() == ("nb:v1", "nb:v2", "nb:v3")
    assert {v: core.catalog.digest(f"nb:{v}") for v in images} == {v: i.digest for v, i in images.items()}
    await until(lambda: any(vm.state.value == "warm" and not vm.pulling and vm.cache.has_image("nb:v3", core.catalog)
                            for vm in core.vms.values()), timeout=120, what="the warm VM holding latest (v3)")
    warm_fetches = {d: registry.blob_gets(d) for d in images["v3"].layer_digests}
    assert set(warm_fetches.values()) == {1}

    # Something of the VM's own, outside any session: a process and a container. Neither may be touched.
    decoy_process = subprocess.Popen(["sleep", "600"], user=1000)  # a uid the old wipe killed
    engine.cli("run", "-d", "--name", "decoy", "--env", f"{TOKEN_ENV}=decoy", f"{registry.host}/nb@{images['v3'].digest}")

    s = follow(runtime)(runtime.allocate(SessionSpec("acceptance-1", "alice", POOL, "nb:v2")))
    assert s.image_digest == images["v2"].digest
    await until(lambda: s.state.value in ("running", "failed"), timeout=120, what="the session running")
    assert s.state.value == "running", s.history
    assert [h.state for h in s.history][-2:] == ["starting", "running"]  # a pull first if the VM lacked v2

    # The VM pulled only what it lacked: whether v2 came with the warm VM's prewarm or with the
    # session, each of its layers was fetched once, the layers it shares with v3 included.
    assert {d: registry.blob_gets(d) for d in images["v2"].layer_digests} == {d: 1 for d in images["v2"].layer_digests}
    [notebook] = containers(engine, f"label=provisioner.session={s.id}")
    assert notebook["State"] == "running"
    info = json.loads(engine.cli("container", "inspect", notebook["Id"]))[0]
    assert info["ImageName"].endswith(f"/nb@{images['v2'].digest}")
    assert info["Config"]["Labels"]["provisioner.user"] == "alice"
    assert (info["HostConfig"]["NanoCpus"], info["HostConfig"]["Memory"]) == (500_000_000, 256 << 20)  # the pool's
    assert f"{TOKEN_ENV}={s.access_token}" in info["Config"]["Env"]

    # The endpoint: the VM's address and the host port the agent reported; only the secret opens it.
    port = int(s.endpoint.rsplit(":", 1)[1])
    assert s.endpoint.startswith("http://10.128.") and port != 8888
    assert get(port, None) == 401 and get(port, "not-the-secret") == 401
    assert get(port, s.access_token) == 200
    # Another user cannot read it: the cluster answers a read for someone else's session NOT_FOUND
    # (the front passes the caller's user; tests/test_registry_fleet.py goes through the front).
    with pytest.raises(NotFound):
        runtime.reads.get(s.id, user_id="mallory")
    assert runtime.reads.get(s.id, user_id="alice").access_token == s.access_token

    # The tag is pushed again while the session runs: the catalog moves on, the session does not.
    push_image(registry, "nb", "v2", build_image("nb:v2", page="v2, rebuilt"))
    runtime.set_catalog(await asyncio.to_thread(source.fetch))
    assert core.catalog.digest("nb:v2") != images["v2"].digest and s.image_digest == images["v2"].digest
    assert json.loads(engine.cli("container", "inspect", notebook["Id"]))[0]["ImageName"] == info["ImageName"]

    # The user leaves files in the workspace; stop ends the container, then the VM is wiped.
    workspace = workspaces / s.id
    (workspace / "model.ckpt").write_bytes(b"weights")
    runtime.stop(s.id, "done")
    await until(lambda: s.state.value == "stopped", timeout=120, what="the session stopped")
    vm = core.vms[s.vm_id]
    await until(lambda: vm.state.value == "warm", timeout=120, what="the VM wiped and warm again")
    assert containers(engine, "label=provisioner.session") == []
    assert not workspaces.exists() or list(workspaces.iterdir()) == []
    assert decoy_process.poll() is None  # not signalled
    assert [c["Names"] for c in containers(engine, "name=decoy") if c["State"] == "running"] == [["decoy"]]
    decoy_process.kill()
