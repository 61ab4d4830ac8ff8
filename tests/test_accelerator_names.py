"""A create names its accelerator by pool (`gpu-p100`) or by accelerator type (`nvidia-tesla-p100`,
as `admin pools` shows it); a running session's reason names its VM apart from the sentence."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from provisioner import cli
from provisioner.model.errors import InvalidArgument
from provisioner.rules.validation import pool_named

POOLS = {"gpu-p100": "nvidia-tesla-p100", "gpu-t4": "nvidia-tesla-t4", "gpu-t4x2": "nvidia-tesla-t4"}


def test_a_pool_or_an_accelerator_type_one_pool_has():
    assert pool_named("gpu-p100", POOLS) == "gpu-p100"
    assert pool_named("nvidia-tesla-p100", POOLS) == "gpu-p100"
    assert pool_named("gpu-h100", POOLS) == "gpu-h100"  # refused later, by validate_spec, with the pools known
    with pytest.raises(InvalidArgument, match=r"several pools \(gpu-t4, gpu-t4x2\): name the pool"):
        pool_named("nvidia-tesla-t4", POOLS)


async def test_the_cli_takes_the_accelerator_type_admin_pools_shows(local_fleet, capsys):
    where = ["--front", local_fleet.front_address, "--data-dir", str(local_fleet.data_dir), "--json"]
    assert await asyncio.to_thread(cli.main, ["admin", "pools", *where]) == 0
    pools = json.loads(capsys.readouterr().out)
    pools = pools["pools"] if isinstance(pools, dict) else pools
    accelerator = next(p["accelerator"] for p in pools if p["name"] == "gpu-p100")
    assert accelerator == "nvidia-tesla-p100"
    argv = ["session", "create", "--user", "ada", "--accelerator", accelerator, "--image", "gpu:latest", "--wait"]
    assert await asyncio.to_thread(cli.main, [*argv, *where]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["pool"] == "gpu-p100" and made["accelerator"] == "gpu-p100" and made["state"] == "running"
    assert re.fullmatch(r"running on a (warm VM that held the image|warm VM that pulled the layers it lacked|new VM)"
                        r" \(VM [\w-]+\)", made["reason"]), made["reason"]
