"""Results tables made from the benchmarks' own output, so the documents cannot drift from it.

    provisioner simulate ... --json > docs/results/simulate/NAME.json     (one run per file)
    python -m provisioner.perf.tables docs/results/simulate/*.json --out docs/results/simulate.md
    python -m provisioner.perf.tables docs/results/simulate/*.json --out docs/results/simulate.md --check
    python -m provisioner.perf.tables docs/economics/*.json --out docs/economics.md --between-markers
    python -m provisioner.perf.tables --kind standby docs/results/standby/*.json --out docs/simulator.md --marker standby
    python -m provisioner.perf.tables --kind serving docs/results/serving/*.json --out docs/performance.md --marker serving
    python -m provisioner.perf.tables --kind preemption docs/results/preemption/*.json --out docs/priority-and-preemption.md --marker preemption

Each row is one run's JSON, with the command that reproduces it (the JSON's `command`). `--check`
exits 1 when the file differs from what the runs give (the test suite checks the shipped tables).
`--between-markers` puts the table into a page written by hand around it: only the text between
the BEGIN and END marker lines of --out is replaced (or, with --check, compared); `--marker NAME`
does so between the lines of that name, so one page can hold several tables. The kinds serving,
queue, commits and floods are the serving path's benchmarks (provisioner/perf/bench_tables.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from provisioner.perf import bench_tables

HEADER = ("Made by `python -m provisioner.perf.tables` from the `provisioner simulate --json` output beside "
          "this file; do not edit by hand. `cost vs assigned` is the run's cost over the cost of the VM time "
          "assigned to sessions (which any policy pays), standby disks included; `fast starts` are sessions "
          "running within 60 s of the request (model time).")
SPOT_NOTE = (" With a Spot tier, `cost vs assigned` prices the time sessions held Spot VMs at the Spot price, and "
             "`vs on demand` is the cost over the same held VM time all on demand (the floor without Spot); "
             "`preemptions` are Spot VMs taken back, with the batch sessions queued again and how many of those ran.")
BEGIN = "<!-- results table: made by python -m provisioner.perf.tables, not to be edited by hand -->"
END = "<!-- end of the results table -->"
COLUMNS = ("trace", "scale", "days", "policy", "sessions", "VM-hours", "standby VM-hours", "cost vs assigned",
           "fast starts", "wait p99", "never started", "wall", "command")
SPOT_COLUMNS_AFTER = {"standby VM-hours": "Spot VM-hours", "cost vs assigned": "vs on demand",
                      "never started": "preemptions: requeued (ran)"}


def row(r: dict) -> list[str]:
    days = f"first {r['days']:g}" if r.get("days") else f"all {r['model_hours'] / 24:.1f}"
    return [r["trace"], str(r["scale"]), days, r["policy"], f"{r['sessions']:,}", f"{r['vm_hours']:,.0f}",
            f"{r['standby_vm_hours']:,.0f}", f"{r['cost_usd'] / r['assigned_cost_usd']:.3f}x",
            f"{r['fast_start_ratio']:.2%}", f"{r['wait_p99_s']:.0f} s", f"{r['never_started']:,}",
            f"{r['wall_s']:.0f} s", f"`{r['command']} --json`"]


def spot_cells(r: dict) -> dict[str, str]:
    """The economics table's Spot columns of a run (a run without Spot VMs has none of them)."""
    if "spot_vm_hours" not in r:
        return {"Spot VM-hours": "0", "vs on demand": f"{r['cost_usd'] / r['assigned_cost_usd']:.3f}x",
                "preemptions: requeued (ran)": "-"}
    return {"Spot VM-hours": f"{r['spot_vm_hours']:,.0f}",
            "vs on demand": f"{r['cost_usd'] / r['assigned_on_demand_cost_usd']:.3f}x",
            "preemptions: requeued (ran)": f"{r['spot_preemptions']:,}: {r['requeued']:,} ({r['requeued_started']:,})"}


def simulate_table(runs: list[dict]) -> str:
    """One row per run; with a run on Spot VMs among them, the Spot columns too."""
    if not any("spot_vm_hours" in r for r in runs):
        return _table(HEADER, COLUMNS, [row(r) for r in runs])
    columns = [c for name in COLUMNS for c in (name, SPOT_COLUMNS_AFTER.get(name)) if c]
    rows = []
    for r in runs:
        cells, extra = dict(zip(COLUMNS, row(r))), spot_cells(r)
        if (rate := flag(r["command"], "--spot-tier")) is not None:
            cells["policy"] += f", Spot tier ({rate} preemptions per VM-hour)"
        rows.append([cells[c] if c in cells else extra[c] for c in columns])
    return _table(HEADER + SPOT_NOTE, tuple(columns), rows)


# The standby tier's table (docs/simulator.md): every bundled trace under the three policies. The
# traces the tier's one constant was tuned on are marked; the target is the tier's acceptance.
TUNED_ON = ("genai-sessions.csv", "openb-sessions.csv", "rollout-sessions.csv")
TARGET_COST_RATIO, TARGET_FAST_STARTS = 1.15, 0.995
STANDBY_HEADER = (f"{HEADER.replace('beside this file', 'in docs/results/standby/')} `target`: cost at most {TARGET_COST_RATIO:g} times the assigned cost with at "
                  f"least {TARGET_FAST_STARTS:.1%} fast starts.")
STANDBY_COLUMNS = ("trace", "policy", "cost vs assigned", "standby VM-hours", "standby cost", "fast starts",
                   "wait p99", "cold / partial starts", "never started", "target", "wall", "command")


def flag(command: str, name: str, default: str | None = None) -> str | None:
    """The value the command line gives flag `name`, or `default`."""
    words = command.split()
    return words[words.index(name) + 1] if name in words else default


def setting(command: str) -> str:
    """The policy and its knob, as the command gives them: "fixed 20 warm", "predictive + standby"."""
    policy = flag(command, "--policy") or "per pool"
    if policy == "fixed":
        return f"fixed {flag(command, '--warm-vms')} warm"
    if policy == "headroom":
        return f"headroom {flag(command, '--headroom')}"
    if "--no-standby" in command.split():
        return f"{policy}, `--no-standby`"
    return f"{policy} + standby" if policy == "predictive" else policy


def standby_row(r: dict) -> list[str]:
    ratio = r["cost_usd"] / r["assigned_cost_usd"]
    meets = ratio <= TARGET_COST_RATIO and r["fast_start_ratio"] >= TARGET_FAST_STARTS
    return [r["trace"] + (" (tuned on)" if r["trace"] in TUNED_ON else ""), setting(r["command"]),
            f"**{ratio:.3f}x**" if meets else f"{ratio:.3f}x", f"{r['standby_vm_hours']:,.0f}",
            f"${r['standby_cost_usd']:,.0f}", f"{r['fast_start_ratio']:.2%}", f"{r['wait_p99_s']:.0f} s",
            f"{r['starts']['cold']} / {r['starts']['partial']}", f"{r['never_started']:,}", "yes" if meets else "no",
            f"{r['wall_s']:.0f} s", f"`{r['command']} --json`"]


def standby_table(runs: list[dict]) -> str:
    order = {"fixed": 0, "headroom": 1, "predictive": 2}
    runs = sorted(runs, key=lambda r: (r["trace"] not in TUNED_ON, r["trace"], order.get(r["policy"], 3),
                                       "--no-standby" in r["command"]))
    return _table(STANDBY_HEADER, STANDBY_COLUMNS, [standby_row(r) for r in runs])


# The Spot table (docs/google-cloud.md): the same trace on demand and on Spot VMs at some rates.
SPOT_HEADER = ("Made by `python -m provisioner.perf.tables` from the `provisioner simulate --json` runs in "
               "docs/results/spot/; do not edit by hand. `started within 60 s`: `fast_start_ratio`, over every session; "
               "`interactive wait p99`: the interactive sessions' (`interactive.wait_p99_s`); `sessions ended by it`: "
               "sessions a preemption ended, the batch ones among them queued again.")
SPOT_COLUMNS = ("capacity", "cost (USD)", "assigned cost (USD)", "VM-hours", "started within 60 s",
                "interactive wait p99", "VMs preempted", "sessions ended by it", "batch requeued (and ran)", "wall",
                "command")


def spot_row(r: dict) -> list[str]:
    rate = flag(r["command"], "--spot", "")
    return [f"Spot, {rate} preemptions per VM-hour" if rate else "on demand", f"{r['cost_usd']:,.2f}",
            f"{r['assigned_cost_usd']:,.2f}", f"{r['vm_hours']:,.0f}", f"{r['fast_start_ratio']:.2%}",
            f"{r['interactive']['wait_p99_s']:.1f} s", f"{r['spot_preemptions']:,}",
            f"{r['spot_preempted_sessions']:,}", f"{r['requeued']:,} ({r['requeued_started']:,})", f"{r['wall_s']:.0f} s",
            f"`{r['command']} --json`"]


def spot_table(runs: list[dict]) -> str:
    runs = sorted(runs, key=lambda r: ("--spot" in r["command"], r["command"]))
    return _table(SPOT_HEADER, SPOT_COLUMNS, [spot_row(r) for r in runs])


# The preemption table (docs/priority-and-preemption.md): one trace with every pool capped, with
# and without a guaranteed share per user.
PREEMPTION_HEADER = ("Made by `python -m provisioner.perf.tables` from the `provisioner simulate --json` runs in "
                     "docs/results/preemption/; do not edit by hand. `share`: GPUs guaranteed to each user in every "
                     "pool (`--share-gpus`); `requeued (ran)`: preempted batch sessions queued again, and how many of "
                     "them ran; waits and fast starts in model time, fast starts within 60 s.")
PREEMPTION_COLUMNS = ("pools capped at", "share", "preempted", "requeued (ran)", "interactive wait p99",
                      "interactive fast starts", "all fast starts", "wall", "command")


def preemption_row(r: dict) -> list[str]:
    share = flag(r["command"], "--share-gpus", "the fleet's")
    return [f"{flag(r['command'], '--max-vms', 'each pool maximum')} VMs", f"{share} GPU" if share == "1" else f"{share} GPUs",
            f"{r['preempted']:,}", f"{r['requeued']:,} ({r['requeued_started']:,})",
            f"{r['interactive']['wait_p99_s']:,.0f} s", f"{r['interactive']['fast_start_ratio']:.2%}",
            f"{r['fast_start_ratio']:.2%}", f"{r['wall_s']:.0f} s", f"`{r['command']} --json`"]


def preemption_table(runs: list[dict]) -> str:
    runs = sorted(runs, key=lambda r: (-int(flag(r["command"], "--max-vms", "0")), r["command"]))  # tightest cap last
    return _table(PREEMPTION_HEADER, PREEMPTION_COLUMNS, [preemption_row(r) for r in runs])


def _bench_table(kind: str):
    header, rows = bench_tables.KINDS[kind]
    return lambda runs: _table(header, *rows(runs))


KINDS = {"simulate": simulate_table, "standby": standby_table, "spot": spot_table, "preemption": preemption_table, **{k: _bench_table(k) for k in bench_tables.KINDS}}


def _table(header: str, columns: tuple[str, ...], rows: list[list[str]]) -> str:
    lines = [header, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines) + "\n"


def markers(name: str = "") -> tuple[str, str]:
    """The BEGIN and END lines of the table `name` ("": a page's only table)."""
    if not name:
        return BEGIN, END
    return (f"<!-- results table {name}: made by python -m provisioner.perf.tables, not to be edited by hand -->",
            f"<!-- end of the results table {name} -->")


def between_markers(page: str, table: str, name: str = "") -> str:
    """`page` with the text between its BEGIN and END lines (of table `name`) replaced by `table`."""
    first, last = markers(name)
    head, begin, rest = page.partition(first + "\n")
    _, end, tail = rest.partition(last)
    if not begin or not end:
        raise ValueError(f"no {first!r} line followed by {last!r} in the page")
    return head + begin + table + end + tail


def load_runs(paths: list[Path]) -> list[dict]:
    """The runs in the files, in the order of their names."""
    return [json.loads(p.read_text()) for p in sorted(paths)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m provisioner.perf.tables", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="JSON files, each one run's `--json` output")
    p.add_argument("--out", type=Path, required=True, help="the Markdown file to write")
    p.add_argument("--check", action="store_true", help="only compare: exit 1 if --out differs")
    p.add_argument("--kind", choices=sorted(KINDS), default="simulate",
                   help="simulate: one row per run; standby: the standby tier's table (docs/simulator.md); spot: "
                        "on demand against Spot (docs/google-cloud.md); preemption: capped pools with and without a "
                        "share (docs/priority-and-preemption.md); serving, queue, commits, floods: those benchmarks' "
                        "`--json` output (docs/performance.md)")
    p.add_argument("--between-markers", action="store_true",
                   help="replace only the text between the marker lines of --out, a page written around the table")
    p.add_argument("--marker", default="", metavar="NAME",
                   help="the marker lines of table NAME, in a page of several (implies --between-markers)")
    args = p.parse_args(argv)
    try:
        table = KINDS[args.kind](load_runs(args.runs))
    except (OSError, ValueError, KeyError) as e:
        print(f"error: cannot read the runs: {e!r}", file=sys.stderr)
        return 1
    if args.between_markers or args.marker:
        try:
            table = between_markers(args.out.read_text(), table, args.marker)
        except (OSError, ValueError) as e:
            print(f"error: {args.out}: {e}", file=sys.stderr)
            return 1
    if args.check:
        if not args.out.is_file() or args.out.read_text() != table:
            print(f"{args.out} is not what the runs give: run without --check to write it", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
