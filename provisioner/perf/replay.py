"""What a replay costs: CPU-seconds per replayed session, this code against an earlier commit's,
in one run on the same machine, with a check that both give the same figures.

    python -m provisioner.perf.replay [--base REF] [--trace FILE] [--scale 50] [--days N] [--rounds 2]

The earlier commit (`--base`, default `main`) is checked out into a temporary git worktree, and
each side replays with `provisioner simulate --json --jobs 1` in a child process whose
PYTHONPATH is its own tree. The CPU time is the child's (user plus system, from the kernel), so
it counts the whole command: start-up, reading the trace, the replay, the results; not the
compiling of the trees' sources, done ahead into a temporary bytecode cache (as an installed
package has its bytecode, even where PYTHONDONTWRITEBYTECODE is set). The sides
alternate for `--rounds` rounds and the least CPU of each is kept (others' work on the machine
only ever adds). `--days N` replays the sessions arriving in the trace's first N days (written
to a temporary trace, the same file for both sides, so the base needs no `--days` of its own).
The JSON figures (all but the wall time, and the command line and window newer code adds) must
be identical, or the benchmark says which differ and exits 1.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from provisioner.sim.trace import first_days, HEADER, read_trace

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRACE = ROOT / "provisioner" / "sim" / "traces" / "genai-sessions.csv"
# Runs the command line in whichever tree PYTHONPATH names.
CHILD = "import sys; from provisioner.cli import main; sys.exit(main(sys.argv[1:]))"


def window(trace: Path, days: float, out: Path) -> Path:
    """The rows of `trace` arriving in its first `days` days (as `simulate --days` takes them, which
    the base may not have), as a trace file at `out`."""
    rows = first_days(read_trace(trace), days)
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER)
        for r in rows:
            writer.writerow([repr(r.arrival_s), r.user, r.kind.value, r.accelerator, r.image, r.region,
                             repr(r.duration_s), "1" if r.abandon else "0"])
    return out


def child_env(tree: Path, pycache: Path) -> dict[str, str]:
    """A child's environment: PYTHONPATH its tree, its modules' bytecode read from (and written to)
    `pycache`, as an installed package's is, even where the environment says not to write any."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONPYCACHEPREFIX": str(pycache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def compile_tree(tree: Path, pycache: Path) -> None:
    """Compiles the tree's modules ahead, so that no measured run compiles source."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "provisioner")],
                   env=child_env(tree, pycache), check=True, stdout=subprocess.DEVNULL)


def replay(tree: Path, trace: Path, scale: int, pycache: Path) -> tuple[float, dict]:
    """(CPU seconds, JSON results) of one `provisioner simulate` in a child process over `tree`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = child_env(tree, pycache)
    done = subprocess.run([sys.executable, "-c", CHILD, "simulate", "--trace", str(trace), "--scale", str(scale),
                           "--json", "--jobs", "1", "--clusters", str(tree / "clusters")],
                          cwd=tree, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"replay in {tree} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, json.loads(done.stdout)


# What describes a run rather than its results: the wall time, and the command line and window
# that newer code adds to the JSON.
NOT_FIGURES = ("wall_s", "command", "days")


def differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    """The keys (dotted) whose values differ, NOT_FIGURES aside."""
    out = []
    for key in sorted(set(a) | set(b)):
        if not prefix and key in NOT_FIGURES:
            continue
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += differences(x, y, f"{prefix}{key}.")
        elif x != y:
            out.append(f"{prefix}{key}: {x!r} != {y!r}")
    return out


def checkout(ref: str, into: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(into), ref], check=True)
    return into


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m provisioner.perf.replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="main", help="the commit to compare with (default main)")
    p.add_argument("--trace", default=str(DEFAULT_TRACE))
    p.add_argument("--scale", type=int, default=50)
    p.add_argument("--days", type=float, default=None, help="only the sessions of the trace's first N days")
    p.add_argument("--rounds", type=int, default=2, help="runs of each side, alternating (least CPU kept)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="replay-bench-") as tmp:
        trace = Path(args.trace).resolve()
        if args.days is not None:
            trace = window(trace, args.days, Path(tmp) / f"first-{args.days:g}-days-{trace.name}")
        base = checkout(args.base, Path(tmp) / "base")
        try:
            sides = {f"base ({args.base})": base, "this tree": ROOT}
            cpu: dict[str, list[float]] = {name: [] for name in sides}
            results: dict[str, dict] = {}
            pycache = Path(tmp) / "pycache"
            for tree in sides.values():
                compile_tree(tree, pycache)
            for r in range(args.rounds):
                for name, tree in sides.items():
                    seconds, results[name] = replay(tree, trace, args.scale, pycache)
                    cpu[name].append(seconds)
                    print(f"round {r + 1}: {name}: {seconds:.1f} CPU-s", file=sys.stderr, flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    (old_name, old), (new_name, new) = results.items()
    sessions = new["sessions"]
    least = {name: min(times) for name, times in cpu.items()}
    print(f"{Path(args.trace).name} x{args.scale}{f', first {args.days:g} days' if args.days else ''}: "
          f"{sessions:,} sessions, {new['events']:,} events")
    for name in sides:
        print(f"  {name:>20}: {least[name]:7.1f} CPU-s, {least[name] / sessions * 1e3:.3f} CPU-ms per session "
              f"(runs: {', '.join(f'{t:.1f}' for t in cpu[name])})")
    print(f"  {'reduction':>20}: {least[old_name] / least[new_name]:.2f}x")
    diff = differences(old, new)
    if diff:
        print("  results DIFFER:\n    " + "\n    ".join(diff))
        return 1
    print(f"  results identical (every JSON figure but {', '.join(NOT_FIGURES)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
