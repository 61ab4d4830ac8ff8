"""An operator's `session list` without --user lists every user's sessions, paged."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml

from conftest import fleet_config, quick_warm_up, warm_fleet
from provisioner import cli
from provisioner import client as api
from provisioner.client.credentials import local_ca
from provisioner.config import load_fleet
from provisioner.v1 import types_pb2 as pb


@pytest.fixture
async def local_fleet(tmp_path):
    """The local fleet, forgetting ended sessions from memory a model minute after they end (0.2 s
    of wall time): lists must read older ones from the store."""
    fleet_config(tmp_path, quick_warm_up)
    path = tmp_path / "clusters" / "fleet.yaml"
    data = yaml.safe_load(path.read_text())
    data["sessions"]["retention_s"] = 60
    path.write_text(yaml.safe_dump(data))
    async with warm_fleet(load_fleet(tmp_path / "clusters"), tmp_path / "data") as handle:
        yield handle


async def test_an_operator_lists_every_users_sessions(local_fleet, capsys):
    made = []
    async with api.AsyncClient(local_fleet.front_address, token=local_fleet.token("local-operator"),
                               ca=local_ca(local_fleet.data_dir)) as c:
        for i in range(5):
            s = await c.create_session(user_id="alice", accelerator="gpu-p100", image="gpu:latest")
            made.append(s.id)
            if i < 3:
                await c.stop_session(s.id)
                # ended (its notebook stopped): a stopping session still counts against the cap
                await local_fleet.watch_until(s.id, pb.SESSION_STATE_STOPPED, pb.SESSION_STATE_FAILED)
        made.append((await c.create_session(user_id="bob", accelerator="gpu-p100", image="gpu:latest")).id)
        await asyncio.sleep(1.5)  # 7 model minutes: the stopped ones are past the retention period
    base = ["--front", local_fleet.front_address, "--data-dir", str(local_fleet.data_dir), "--json"]
    assert await asyncio.to_thread(cli.main, ["session", "list", *base]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(s["id"] for s in listed["sessions"]) == sorted(made)
    assert await asyncio.to_thread(cli.main, ["session", "list", "--user", "alice", *base]) == 0
    assert len(json.loads(capsys.readouterr().out)["sessions"]) == 5
    # paged: two at a time, every session once
    seen, token = [], ""
    while True:
        argv = ["session", "list", "--page-size", "2", *base] + (["--page-token", token] if token else [])
        assert await asyncio.to_thread(cli.main, argv) == 0
        page = json.loads(capsys.readouterr().out)
        assert len(page["sessions"]) <= 2
        seen += [s["id"] for s in page["sessions"]]
        if not (token := page["next_page_token"]):
            break
    assert sorted(seen) == sorted(made)
