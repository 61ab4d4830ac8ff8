"""What `provisioner simulate` does before it replays: a short replay's start-up is a good part of
its CPU, so it imports and reads only what the replay needs. Checked in fresh processes, as a user
runs the command, except where a count of calls says it."""

from __future__ import annotations

import subprocess
import sys

from provisioner.cli import main
from provisioner.sim import parallel
from test_simulate import write_trace

# Modules a replay in one process has no use for: the API client (grpc, the stubs), the process
# pool of --jobs, and the quota meter of --quotas.
UNUSED = ("grpc", "provisioner.client", "multiprocessing", "concurrent.futures", "provisioner.sim.quotas")


def _simulate_in_a_fresh_process(trace, *flags: str) -> str:
    code = ("import sys; from provisioner.cli import main; rc = main(['simulate', '--trace', sys.argv[1], '--json', "
            f"*sys.argv[2:]]); print(rc, sorted(m for m in {UNUSED!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, str(trace), *flags], capture_output=True, text=True,
                          timeout=120)
    *_, last = done.stdout.strip().splitlines() or [""]
    assert last.startswith("0 "), done.stdout + done.stderr
    return last


def test_a_replay_in_one_process_imports_only_what_it_uses(tmp_path):
    trace = write_trace(tmp_path)
    assert _simulate_in_a_fresh_process(trace, "--jobs", "1") == "0 []"
    # The check sees them where they are used.
    assert _simulate_in_a_fresh_process(trace, "--jobs", "1", "--quotas") == "0 ['provisioner.sim.quotas']"
    assert "'multiprocessing'" in _simulate_in_a_fresh_process(trace, "--jobs", "2")


def test_simulate_reads_the_fleet_and_the_trace_once(tmp_path, monkeypatch, capsys):
    calls = {"load_fleet": 0, "read_trace": 0}

    def counted(name, f):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return f(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(parallel, "load_fleet", counted("load_fleet", parallel.load_fleet))
    monkeypatch.setattr(parallel, "read_trace", counted("read_trace", parallel.read_trace))
    assert main(["simulate", "--trace", str(write_trace(tmp_path)), "--scale", "2", "--json", "--jobs", "1"]) == 0
    assert '"scaled_peak_vms": ' in capsys.readouterr().out
    assert calls == {"load_fleet": 1, "read_trace": 1}
