"""The serving-path benchmarks' tables (docs/performance.md), from their `--json` output: one run
per file, every row with the command that made it (the JSON's `command`, `--json` added).
Rendered by `python -m provisioner.perf.tables --kind serving|queue|commits` (see there)."""

from __future__ import annotations

SERVING_HEADER = ("Made by `python -m provisioner.perf.tables` from `python -m provisioner.perf.serving --json` output; "
                  "do not edit by hand. Each cell: the provisioner's calls/s over the echo's in the same run, its "
                  "calls/s in brackets, then its p99 latency; medians of the interleaved runs; creates that found no warm VM "
                  "(more than the pool holds), and errors, are counted where there were any.")
QUEUE_HEADER = ("Made by `python -m provisioner.perf.tables` from `python -m provisioner.perf.queue --json` output; "
                "do not edit by hand. The core's own time (no I/O, commands not carried out), per stop of the session "
                "at the head of the queue for each thousand stops, and for the step in which the rest of the queue "
                "times out.")
COMMITS_HEADER = ("Made by `python -m provisioner.perf.tables` from `python -m provisioner.perf.commits --json` output; "
                  "do not edit by hand. Durable writes a second, each writer waiting for its own.")
LABELS = {"create": "CreateSession (warm)", "get": "GetSession", "mix": "mix"}


def _command(r: dict) -> str:
    return f"`{r['command']} --json`"


def serving_rows(runs: list[dict]) -> tuple[tuple[str, ...], list[list[str]]]:
    levels = sorted({row["in_flight"] for r in runs for row in r["rows"]})
    columns = ("workload", *(f"{k} in flight" for k in levels), "runs", "warm VMs", "command")
    out = []
    for r in runs:
        by = {(row["workload"], row["in_flight"]): row for row in r["rows"]}
        for w in dict.fromkeys(row["workload"] for row in r["rows"]):
            cells = []
            for k in levels:
                row = by.get((w, k))
                cells.append(_serving_cell(row) if row else "")
            out.append([LABELS.get(w, w), *cells, f"{r['runs']} x {r['seconds']:g} s", f"{r['vms']:,}", _command(r)])
    return columns, out


def _serving_cell(row: dict) -> str:
    p = row["provisioner"]
    cell = f"{row['ratio']:.2f} ({p['calls_per_s']:,.0f}), p99 {p['p99_ms']:.1f} ms"
    # Creates past the pool's warm VMs queue or start cold: the cell says how many.
    return cell + "".join(f", {p[k]:,} {label}" for k, label in (("not_warm", "not warm"), ("errors", "errors"))
                          if p.get(k))


def queue_rows(runs: list[dict]) -> tuple[tuple[str, ...], list[list[str]]]:
    columns = ("what", "ms each", "places moved each", "records changed each", "command")
    out = []
    for r in runs:
        for b in r["stops"]:
            out.append([f"a stop at the head, {b['queued']:,}-{b['queued'] + b['stops']:,} queued",
                        f"{b['ms_per_stop']:.2f}", f"{b['moved_per_stop']:,.0f}", f"{b['records_per_stop']:g}",
                        _command(r)])
        e = r["expired"]
        out.append([f"{e['sessions']:,} queued sessions timing out in one step", f"{e['ms']:,.0f}", "", "",
                    _command(r)])
    return columns, out


def commits_rows(runs: list[dict]) -> tuple[tuple[str, ...], list[list[str]]]:
    columns = ("store", "writers", "ungrouped commits/s", "grouped commits/s", "writes per transaction", "command")
    out = [[r["store"], str(row["writers"]), f"{row['ungrouped']['commits_per_s']:,.0f}",
            f"{row['grouped']['commits_per_s']:,.0f}", f"{row['grouped']['writes_per_transaction']:.1f}", _command(r)]
           for r in runs for row in r["rows"]]
    return columns, out


# The floods' targets (issue-level acceptance of the benchmark): bob's create p50 within this many
# times his quiet p50, and no create slower than this.
FLOODS_P50_VS_QUIET, FLOODS_MAX_MS = 2.0, 250.0
FLOODS_HEADER = ("Made by `python -m provisioner.perf.tables` from `python -m provisioner.perf.floods --json` output; "
                 "do not edit by hand. Each row starts once its flood is under way (its first call answered; for "
                 "`idle`, its connections open and held by the front). Bob creates and stops a session every 0.5 s on "
                 "the channel he holds, alone (`quiet`) and beside each flood; `slowest at`: when his slowest create "
                 "began, seconds into the row; `new client`: a client connecting as the row starts (TCP, TLS) and its "
                 "first create; `in the ramp`: the same, made as the idle flood began opening its 3,000 connections, "
                 "in each of several ramps: their median, and the slowest with its connection until ready and its "
                 "create apart; `ramp`: from the flood's first connection until the front held them all, shortest "
                 "and longest; `CPU s`: what the fleet's processes and the flood's used during the row; `load`: the "
                 "machine's 1-minute load average as the row ended; `targets`: bob's p50 within "
                 f"{FLOODS_P50_VS_QUIET:g}x quiet and no create over {FLOODS_MAX_MS:g} ms, the new clients' included.")


def floods_rows(runs: list[dict]) -> tuple[tuple[str, ...], list[list[str]]]:
    columns = ("fleet", "flood", "bob's creates", "p50", "vs quiet", "max", "slowest at", "new client", "in the ramp",
               "ramp", "flood calls", "fleet CPU s", "flood CPU s", "load", "targets", "command")
    out = []
    for r in runs:
        for row in r["rows"]:
            clients = [row["new_client"]["ms"], *(ramp["client"]["ms"] for ramp in row["ramps"] or ())]
            met = (row["p50_vs_quiet"] <= FLOODS_P50_VS_QUIET and row["max_ms"] <= FLOODS_MAX_MS
                   and max(clients) <= FLOODS_MAX_MS)
            out.append([row["fleet"], row["flood"], f"{row['creates']:,}", f"{row['p50_ms']:.1f} ms",
                        f"{row['p50_vs_quiet']:.2f}x", f"{row['max_ms']:.1f} ms", f"{row['slowest_at_s']:.1f} s",
                        f"{row['new_client']['ms']:,.1f} ms", _ramp_clients(row["ramps"]), _ramp_seconds(row["ramps"]),
                        f"{row['flood_calls']:,}", f"{row['fleet_cpu_s']:.1f}", f"{row['flood_cpu_s']:.1f}",
                        f"{row['load']:.2f}", "met" if met else "**missed**", _command(r)])
    return columns, out


def _ramp_clients(ramps: list[dict] | None) -> str:
    if not ramps:
        return ""
    clients = sorted((ramp["client"] for ramp in ramps), key=lambda c: c["ms"])
    median, slowest = clients[(len(clients) - 1) // 2], clients[-1]
    if slowest["ready_ms"] is None:
        phases = "no connection"
    else:
        create = "failed" if slowest["create_ms"] is None else f"{slowest['create_ms']:,.1f}"
        phases = f"ready {slowest['ready_ms']:,.1f}, create {create}"
    return f"{median['ms']:,.1f} ms; max {slowest['ms']:,.1f} ms ({phases}) of {len(clients)}"


def _ramp_seconds(ramps: list[dict] | None) -> str:
    if not ramps:
        return ""
    if any(ramp["s"] is None for ramp in ramps):
        return "not all held"
    seconds = sorted(ramp["s"] for ramp in ramps)
    return f"{seconds[0]:.2f}-{seconds[-1]:.2f} s"


# kind -> (the header, the columns and rows of the runs)
KINDS = {"serving": (SERVING_HEADER, serving_rows), "queue": (QUEUE_HEADER, queue_rows),
         "commits": (COMMITS_HEADER, commits_rows), "floods": (FLOODS_HEADER, floods_rows)}
