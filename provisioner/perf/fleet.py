"""The processes a serving benchmark runs: the front and one cluster (each `provisioner serve`,
as deployed) or the echo pair, with their config and the local TLS and token material made
beforehand, so that processes starting together do not race to make them."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from provisioner.config import default_clusters_dir, load_fleet
from provisioner.observability.telemetry import ENV_SAMPLE

CLUSTER = "us-central1"
POOL = "gpu-p100"
TIME_SCALE = 30.0
SPANS_DUE_MS = 500  # the fleet's processes write a partial batch of spans within this
_CLI = "import sys; from provisioner.cli import main; sys.exit(main())"


_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port free now and not handed out before by this process: the kernel may offer
    the same free port twice in a row, and the ports are bound only later, by other processes."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def write_clusters(root: Path, warm_vms: int, cluster_port: int, front_port: int,
                   disk_cache_gb: float | None = None) -> Path:
    """The shipped fleet cut to one cluster whose gpu-p100 pool is held at `warm_vms` VMs, with a
    fast simulated cloud (the benchmark waits for the pool, not for boots and pulls) and quotas
    no load reaches (a benchmark's users are few and busy). A smaller `disk_cache_gb` than the
    pool's (about 40 releases) makes warming up quicker: a VM prewarms what its disk holds."""
    target = root / "clusters"
    shutil.copytree(default_clusters_dir(), target)
    for path in target.glob("*.yaml"):
        if path.name not in ("fleet.yaml", "images.yaml", f"{CLUSTER}.yaml"):
            path.unlink()
    path = target / f"{CLUSTER}.yaml"
    data = yaml.safe_load(path.read_text())
    data["address"] = f"127.0.0.1:{cluster_port}"
    data["sim"].update(boot_s=1, boot_jitter_s=0, pull_bytes_per_s=1e13, wipe_s=1)
    pool = next(p for p in data["pools"] if p["name"] == POOL)
    pool.update(min_vms=warm_vms, max_vms=warm_vms + 100, autoscaler="fixed", warm_vms=0)
    if disk_cache_gb is not None:
        pool["disk_cache_gb"] = disk_cache_gb
    data["pools"] = [pool]
    path.write_text(yaml.safe_dump(data))
    fleet = yaml.safe_load((target / "fleet.yaml").read_text())
    fleet["front"]["address"] = f"127.0.0.1:{front_port}"
    fleet["quotas"] = {"gpu_hours_per_week": 1e9, "max_active_sessions_per_user": 10**9}
    (target / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    return target


def prepare_security(clusters: Path, data_dir: Path) -> str:
    """Makes the local CA, every process's certificate and the token key; returns the name the
    cluster's certificate carries (what a client of it checks)."""
    from provisioner.security.tokens import ensure_local_key
    from provisioner.cli.serve import local_tls

    fleet = load_fleet(clusters)
    local_tls(fleet, data_dir, "front")
    ensure_local_key(data_dir / "auth")
    return fleet.settings.security.cluster_name(CLUSTER)


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    metrics_port: int | None = None  # where it serves /metrics, if it does

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()


def spawn(name: str, argv: list[str], ready: str, log_dir: Path, env: dict[str, str] | None = None) -> Proc:
    """Starts a process and waits until a line of its stdout starts with `ready`; its stderr goes
    to a log file, named in the error if it never gets there."""
    log = log_dir / f"{name}.log"
    popen = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=log.open("wb"),
                             env={**os.environ, **(env or {})})
    proc = Proc(name, popen)
    for line in popen.stdout:
        if line.decode(errors="replace").startswith(ready):
            return proc
    proc.stop()
    tail = log.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"{name} exited before it was ready; its log ends:\n{tail}")


def start_fleet(clusters: Path, data_dir: Path, log_dir: Path, traces: str, sample: float = 1.0) -> list[Proc]:
    """The cluster, then the front, as `provisioner serve` runs them; `sample`: the share of new
    traces recorded."""
    common = ["--clusters", str(clusters), "--data-dir", str(data_dir), "--time-scale", str(TIME_SCALE),
              "--traces", traces, "--log-level", "WARNING"]
    # Partial batches of spans within SPANS_DUE_MS (not the SDK's 5 s), so the spans of a
    # measurement's last calls are in the file soon after it (provisioner/perf/phases.py).
    env = {"PROVISIONER_TRACES_FILE": str(data_dir / "traces.jsonl"), "OTEL_BSP_SCHEDULE_DELAY": str(SPANS_DUE_MS),
           ENV_SAMPLE: str(sample)}
    ports = {"cluster": free_port(), "front": free_port()}  # /metrics: the event loop's lag
    cluster = spawn("cluster", ["-c", _CLI, "serve", "cluster", "--name", CLUSTER, *common,
                                "--metrics-address", f"127.0.0.1:{ports['cluster']}"], "cluster ", log_dir, env)
    cluster.metrics_port = ports["cluster"]
    try:
        front = spawn("front", ["-c", _CLI, "serve", "front", *common,
                                "--metrics-address", f"127.0.0.1:{ports['front']}"], "front listening", log_dir, env)
    except BaseException:
        cluster.stop()
        raise
    front.metrics_port = ports["front"]
    return [front, cluster]


def start_up(clusters: Path, data_dir: Path, log_dir: Path, traces: str) -> list[Proc]:
    """The whole fleet in one process, as `provisioner up` runs it, with its /metrics port."""
    port = free_port()
    up = spawn("up", ["-c", _CLI, "up", "--clusters", str(clusters), "--data-dir", str(data_dir), "--time-scale",
                      str(TIME_SCALE), "--traces", traces, "--log-level", "WARNING",
                      "--metrics-address", f"127.0.0.1:{port}"], "front ", log_dir)
    up.metrics_port = port
    return [up]


def start_echo(data_dir: Path, log_dir: Path, address: str, backend_name: str) -> list[Proc]:
    backend_address = f"127.0.0.1:{free_port()}"
    backend = spawn("echo-backend", ["-m", "provisioner.perf.echo", "backend", backend_address, str(data_dir)],
                    "listening", log_dir)
    try:
        forward = spawn("echo-forward", ["-m", "provisioner.perf.echo", "forward", address, backend_address,
                                         str(data_dir), backend_name], "listening", log_dir)
    except BaseException:
        backend.stop()
        raise
    return [forward, backend]
