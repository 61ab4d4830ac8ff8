"""`provisioner up` as a new user runs it: its own OS process, on a copy of the shipped fleet whose
addresses are free loopback ports; the tests read what it prints."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from pathlib import Path

import yaml

from provisioner.config import default_clusters_dir
from provisioner.perf.fleet import free_port

PROVISIONER = Path(sys.executable).with_name("provisioner")
CLUSTER_FILES = ("us-central1.yaml", "europe-west4.yaml", "asia-east1.yaml")


def clusters_on_free_ports(target: Path) -> Path:
    """The shipped fleet config copied to `target`, every address on a free port."""
    shutil.copytree(default_clusters_dir(), target)
    fleet = yaml.safe_load((target / "fleet.yaml").read_text())
    fleet["front"]["address"] = f"127.0.0.1:{free_port()}"
    (target / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    for name in CLUSTER_FILES:
        data = yaml.safe_load((target / name).read_text())
        data["address"] = f"127.0.0.1:{free_port()}"
        (target / name).write_text(yaml.safe_dump(data))
    return target


def front_of(clusters: Path) -> str:
    return yaml.safe_load((clusters / "fleet.yaml").read_text())["front"]["address"]


def ports_of(clusters: Path) -> list[str]:
    """Every port the fleet's config names."""
    return [front_of(clusters).rsplit(":", 1)[1]] + [
        yaml.safe_load((clusters / n).read_text())["address"].rsplit(":", 1)[1] for n in CLUSTER_FILES]


class Up:
    """One `provisioner up` process; `await started()` returns once its front listens."""

    def __init__(self, clusters: Path, data_dir: Path, *extra: str, time_scale: float = 300):
        self.argv = [str(PROVISIONER), "up", "--clusters", str(clusters), "--data-dir", str(data_dir),
                     "--traces", "none", "--time-scale", f"{time_scale:g}", *extra]
        self.proc: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []

    async def launch(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PROVISIONER_")}
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)

    async def started(self, timeout: float = 30.0) -> None:
        await self.launch()

        async def front_line() -> None:
            while True:
                line = (await self.proc.stdout.readline()).decode()
                assert line, f"up ended: {(await self.proc.stderr.read()).decode()}"
                self.lines.append(line)
                if line.startswith("time "):
                    return

        await asyncio.wait_for(front_line(), timeout)

    async def ends(self, timeout: float = 30.0) -> tuple[int, str]:
        """Waits for the process to exit by itself: its exit code and stderr."""
        if self.proc is None:
            await self.launch()
        _, err = await asyncio.wait_for(self.proc.communicate(), timeout)
        return self.proc.returncode, err.decode()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.communicate(), 20)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
