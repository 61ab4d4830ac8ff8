"""A throwaway PostgreSQL server for tests, from the machine's PostgreSQL binaries.

initdb refuses to run as root, so as root the server runs as the `postgres` system user. When no
server can start, tests that need one skip with the reason, unless PROVISIONER_REQUIRE_POSTGRES
is set (CI sets it), in which case they fail.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from typing import Iterator

import pytest

USER = "provisioner"
MEMORY_DIR = "/dev/shm"
MEMORY_NEEDED = 2 << 30  # the server's files with a hundred databases (8 MB each), and room to spare


@dataclass
class PgServer:
    data_dir: str
    port: int
    run_as: list[str]

    @property
    def admin_url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.admin_url, autocommit=True) as db:
            db.execute(f"CREATE DATABASE {name}")
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{name}"

    def pause(self) -> None:
        """Shuts the server down (fast: every connection is ended), keeping its data."""
        subprocess.run([*self.run_as, "pg_ctl", "-D", self.data_dir, "-m", "fast", "-w", "stop"],
                       capture_output=True, timeout=60, check=True)

    def resume(self) -> None:
        """Starts it again where it was, on the same port; returns once it takes connections."""
        _pg_ctl_start(self.run_as, self.data_dir, self.port)

    def stop(self) -> None:
        subprocess.run([*self.run_as, "pg_ctl", "-D", self.data_dir, "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _data_parent() -> str | None:
    """Where the server's files go: in memory where the machine has room there, else the temporary
    directory. Each new database copies its template's files, and the suite makes dozens: sixty took
    16 s on a loaded two-core machine's disk (ext4 with online discard), 5 s in memory."""
    try:
        return MEMORY_DIR if shutil.disk_usage(MEMORY_DIR).free >= MEMORY_NEEDED else None
    except OSError:
        return None


def start_server() -> PgServer:
    """Starts a server on a free loopback port; raises RuntimeError saying why it cannot."""
    if not shutil.which("initdb") or not shutil.which("pg_ctl"):
        raise RuntimeError("initdb/pg_ctl not found on PATH (install the PostgreSQL server binaries)")
    run_as: list[str] = []
    data_dir = tempfile.mkdtemp(prefix="provisioner-pg-", dir=_data_parent())
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            raise RuntimeError("running as root and there is no 'postgres' user to run the server as") from None
        os.chown(data_dir, owner.pw_uid, owner.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    port = _free_port()

    def run(*argv: str) -> None:
        out = subprocess.run([*run_as, *argv], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {out.stderr.strip() or out.stdout.strip()}")

    run("initdb", "-D", data_dir, "-U", USER, "-A", "trust", "--no-sync", "-E", "UTF8")
    _pg_ctl_start(run_as, data_dir, port)
    return PgServer(data_dir, port, run_as)


def _pg_ctl_start(run_as: list[str], data_dir: str, port: int) -> None:
    out = subprocess.run([*run_as, "pg_ctl", "-D", data_dir, "-w", "-l", os.path.join(data_dir, "server.log"), "-o",
                          f"-p {port} -k {data_dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
                          "start"], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"pg_ctl failed: {out.stderr.strip() or out.stdout.strip()}")


def skip_or_fail(reason: str) -> None:
    if os.environ.get("PROVISIONER_REQUIRE_POSTGRES"):
        pytest.fail(f"PostgreSQL is required here but cannot start: {reason}")
    pytest.skip(f"NO POSTGRESQL: {reason}")


def serving() -> Iterator[PgServer]:
    """A fixture's body: a server started, yielded, stopped (skipped or failed if none can start)."""
    try:
        server = start_server()
    except RuntimeError as e:
        skip_or_fail(str(e))
    yield server
    server.stop()
