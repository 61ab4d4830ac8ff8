"""`provisioner agent`: the process on every GPU VM (see provisioner/agent/__init__.py)."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("agent", help="run the agent on a GPU VM (commands from metadata, health as guest attributes)")
    p.add_argument("--config", type=Path, help="agent settings (YAML); defaults otherwise")
    p.add_argument("--metadata-url", help="the metadata server (default: the VM's own)")
    p.add_argument("--state-dir", type=Path, help="where finished command ids are kept")
    p.add_argument("--simulate", type=Path, metavar="DIR",
                   help="fake GPU, container runtime and host, with their state in DIR (no GPU needed)")
    p.add_argument("--simulate-bytes-per-s", type=float, default=1e9, help="with --simulate: pull speed")
    p.add_argument("--simulate-gpus", type=Path, metavar="DIR",
                   help="a fake GPU alone (its state in DIR), with the real container engine and host")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from provisioner.agent import config as agent_config
    from provisioner.agent.agent import Agent, DoneIds
    from provisioner.agent.engine import DockerEngine
    from provisioner.agent.gpu import Gpus
    from provisioner.agent.host import LocalHost
    from provisioner.agent.metadata import HttpMetadata
    from provisioner.common.clock import RealClock

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cfg = agent_config.load(args.config)
    updates = {k: v for k, v in (("metadata_url", args.metadata_url), ("state_dir", args.state_dir)) if v}
    cfg = cfg.model_copy(update=updates)
    clock = RealClock()
    if args.simulate:
        from provisioner.agent.simulated import simulated

        host, runtime, nvml = simulated(args.simulate, clock, args.simulate_bytes_per_s)
        gpus = Gpus(nvml, reset=host.reset_gpus)
    else:
        host, runtime, gpus = LocalHost(), DockerEngine(cfg.engine_url), Gpus()
        if args.simulate_gpus:
            from provisioner.agent.simulated import fake_gpus

            gpus = fake_gpus(args.simulate_gpus)
    agent = Agent(cfg, HttpMetadata(cfg.metadata_url), runtime, gpus, host, clock,
                  DoneIds(cfg.state_dir / "done.json"))
    try:
        asyncio.run(agent.run())
    except KeyboardInterrupt:
        pass
    return 0
