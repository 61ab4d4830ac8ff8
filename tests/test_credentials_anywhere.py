"""Clients find the local fleet's CA and key from PROVISIONER_DATA_DIR or the per-user default
($XDG_DATA_HOME/provisioner), wherever they run; a refused certificate is named as such, with the
flags that fix it, and no gRPC log line reaches the terminal."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from test_client import readme_example

PROVISIONER = Path(sys.executable).with_name("provisioner")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PROVISIONER_") and k not in ("XDG_DATA_HOME", "GRPC_VERBOSITY")}
    return {**env, **extra}


async def _run(*argv: str, cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(*argv, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def test_the_client_example_runs_outside_the_checkout_with_the_data_dir_set(local_fleet, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "backend.py").write_text(readme_example())
    env = _env(PROVISIONER_DATA_DIR=str(local_fleet.data_dir), PROVISIONER_FRONT=local_fleet.front_address)
    code, out, err = await _run(sys.executable, "backend.py", cwd=elsewhere, env=env)
    assert code == 0, err
    assert out.splitlines()[-1].startswith("running on ")


async def test_the_cli_finds_the_per_user_data_dir_wherever_it_runs(local_fleet, tmp_path):
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    (xdg / "provisioner").symlink_to(local_fleet.data_dir)
    code, out, err = await _run(str(PROVISIONER), "session", "list", "--front", local_fleet.front_address,
                                cwd=tmp_path, env=_env(XDG_DATA_HOME=str(xdg)))
    assert code == 0, err
    assert out.split()[:2] == ["ID", "STATE"]


async def test_a_refused_certificate_names_the_ca_and_the_flags(local_fleet, tmp_path):
    empty = tmp_path / "not-the-fleets"
    empty.mkdir()
    code, out, err = await _run(str(PROVISIONER), "session", "list", "--front", local_fleet.front_address,
                                "--timeout", "5", cwd=tmp_path,
                                env=_env(PROVISIONER_DATA_DIR=str(empty),
                                         PROVISIONER_TOKEN=local_fleet.token("local-operator")))
    assert code == 1
    assert "certificate was refused" in err and "--ca" in err and "--data-dir" in err, err
    assert f"no local fleet's CA at {empty / 'tls' / 'ca.pem'}" in err, err
    assert "start the local fleet" not in err
    assert ".cc:" not in err and "ssl_transport_security" not in err, err  # no gRPC C log lines
