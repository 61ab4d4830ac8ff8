"""An agent's world without a GPU: the fakes of provisioner/agent/fakes.py assembled for
`provisioner agent --simulate DIR`, and an abusive session (a miner) for tests and the simulated
cloud."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from provisioner.agent.fakes import FakeHost, FakeNvml, FakeRuntime, State
from provisioner.agent.usage import Connection, Usage
from provisioner.common.clock import Clock


# ---- an abusive session -----------------------------------------------------------------------

MINERS = ("xmrig", "t-rex", "nbminer", "lolminer", "phoenixminer", "nanominer")
MINING_POOL_PORTS = (3333, 4444, 5555, 7777, 14444, 45700)


@dataclass(frozen=True)
class Miner:
    """A session that mines: a miner's process, using every GPU fully, connected to a pool."""

    name: str
    pool: Connection

    def usage(self, gpus: int = 1) -> Usage:
        """What the agent reports of it (the simulated cloud reports this without an agent)."""
        return Usage((100,) * gpus, (self.name,), ("bash", self.name), (self.pool,))


def miner(seed: int) -> Miner:
    """A miner picked by seed: its program and its pool (a public address, a pool port)."""
    rng = random.Random(seed)
    name = rng.choice(MINERS)
    address = f"45.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
    return Miner(name, Connection(address, rng.choice(MINING_POOL_PORTS)))


def mine(host: FakeHost, nvml: FakeNvml, seed: int, pid: int = 31337, uid: int = 1001) -> Miner:
    """Starts a seeded miner in the fakes' session: its process and connection, every GPU busy."""
    m = miner(seed)
    host.start_process(pid, uid, m.name, gpu=True, connections=(m.pool,))
    for gpu in nvml.state.data["gpus"]:
        gpu["utilization"] = 100
    nvml.state.save()
    return m


# ---- metadata server --------------------------------------------------------------------------

def fake_gpus(directory: Path):
    """A fake GPU for an agent whose engine and host are real (`--simulate-gpus DIR`): its
    processes are those of a fake host in DIR, so none of the real ones ever holds it."""
    from provisioner.agent.gpu import Gpus

    directory.mkdir(parents=True, exist_ok=True)
    host = FakeHost(State({}, directory / "host.json"))
    return Gpus(FakeNvml(host, State({}, directory / "gpu.json")), reset=host.reset_gpus)


def simulated(directory: Path, clock: Clock, bytes_per_s: float) -> tuple[FakeHost, FakeRuntime, FakeNvml]:
    """The fakes for `provisioner agent --simulate DIR`, with their state in DIR's JSON files."""
    directory.mkdir(parents=True, exist_ok=True)
    host = FakeHost(State({}, directory / "host.json"))
    return (host, FakeRuntime(clock, host, State({}, directory / "containers.json"), bytes_per_s),
            FakeNvml(host, State({}, directory / "gpu.json")))
