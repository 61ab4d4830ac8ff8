"""Flags go anywhere on the command line: before the command, between group and command, or after."""

from __future__ import annotations

import asyncio
import json

import pytest

from provisioner import cli
from provisioner.cli.flag_order import hoist


@pytest.mark.parametrize("argv, expected", [
    (["--user", "alice", "session", "list"], ["session", "list", "--user", "alice"]),
    (["--json", "--user=bob", "session", "--page-size", "2", "list", "--all"],
     ["--json", "session", "list", "--all", "--user=bob", "--page-size", "2"]),
    (["session", "list", "--user", "x"], ["session", "list", "--user", "x"]),
    (["--data-dir", "d", "up"], ["up", "--data-dir", "d"]),
    (["--front", "h:1", "session", "get", "s1"], ["--front", "h:1", "session", "get", "s1"]),
])
def test_flags_before_their_command_move_after_it(argv, expected):
    assert hoist(cli.build_parser(), argv) == expected


async def test_the_cli_takes_flags_before_the_command(local_fleet, capsys):
    where = ["--front", local_fleet.front_address, "--data-dir", str(local_fleet.data_dir)]
    argv = ["--user", "alice", "--json", *where, "session", "create", "--accelerator", "gpu-p100", "--image",
            "gpu:latest"]
    assert await asyncio.to_thread(cli.main, argv) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["user"] == "alice"
    assert await asyncio.to_thread(cli.main, ["--user", "alice", *where, "session", "--json", "list"]) == 0
    assert [s["id"] for s in json.loads(capsys.readouterr().out)["sessions"]] == [made["id"]]
    assert await asyncio.to_thread(cli.main, ["--user", "nobody", *where, "session", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sessions"] == []
