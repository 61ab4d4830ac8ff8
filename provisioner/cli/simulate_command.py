"""`provisioner simulate`: replay a session trace through the cluster logic on a virtual clock."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


CLUSTERS_HELP = ("fleet config directory (default: $PROVISIONER_CLUSTERS, else /etc/provisioner, else a source "
                 "checkout's clusters/)")


def register(sub: argparse._SubParsersAction, clusters_help: str) -> None:
    sim = sub.add_parser("simulate", help="replay a session trace through the cluster logic on a virtual clock")
    sim.add_argument("--trace", required=True, help="session trace CSV (arrival_s,user,kind,accelerator,...)")
    sim.add_argument("--scale", type=int, default=1, help="superimpose K shifted copies of the trace (default 1)")
    sim.add_argument("--days", type=float, default=None, metavar="N",
                     help="only the sessions arriving in the trace's first N days: a quick run (default: all)")
    sim.add_argument("--seed", type=int, default=0, help="seed for the physics, ids and copy offsets")
    sim.add_argument("--clusters", default=None, help=clusters_help)
    sim.add_argument("--policy", choices=["fixed", "headroom", "predictive"], default=None,
                     help="autoscaler for every pool (default: each pool's own, from its config)")
    sim.add_argument("--headroom", type=float, default=None, metavar="FRACTION",
                     help="headroom policy: warm VMs as a fraction of demand")
    sim.add_argument("--warm-vms", type=int, default=None, metavar="N", help="fixed policy: warm VMs per pool")
    sim.add_argument("--wait-probability", type=float, default=None, metavar="P",
                     help="predictive policy: target share of requests that wait for a VM")
    sim.add_argument("--standby", action=argparse.BooleanOptionalAction, default=None,
                     help="the standby tier (stopped VMs) on or off in every pool (default: on for predictive "
                          "where the pool's config has it, off for fixed and headroom)")
    sim.add_argument("--quotas", action="store_true",
                     help="check each create against the fleet's quotas as the front does (refusals counted)")
    sim.add_argument("--flood", type=int, default=0, metavar="N",
                     help="add one user sending N creates within 10 s halfway through the trace")
    sim.add_argument("--max-vms", type=int, default=None, metavar="N",
                     help="cap every pool at N VMs (default: each pool's own maximum)")
    sim.add_argument("--share-gpus", type=int, default=None, metavar="N",
                     help="GPUs guaranteed to each user in every pool: sessions within it preempt "
                          "over-share batch sessions when a pool is full (default: the fleet's priority section)")
    sim.add_argument("--grace", type=float, default=None, metavar="SECONDS",
                     help="a preempted session's grace period (default: the fleet's)")
    sim.add_argument("--requeue", action="store_true", help="batch sessions ask to be queued again if preempted")
    sim.add_argument("--spot", type=float, default=None, metavar="PER_HOUR",
                     help="every pool on Spot VMs (priced at its spot_price_fraction), each running VM preempted "
                          "at this rate per hour; a preempted batch session is queued again")
    sim.add_argument("--spot-tier", type=float, default=None, metavar="PER_HOUR",
                     help="a Spot tier in every pool: batch sessions, and the VMs kept for them, on Spot VMs "
                          "preempted at this rate per hour, interactive ones on demand (docs/warm-pools.md)")
    sim.add_argument("--plot", default=None, metavar="PNG",
                     help="draw each region and pool over time: VMs (assigned, warm, starting) and queue, waits, cost")
    sim.add_argument("--jobs", type=int, default=os.cpu_count() or 1, metavar="N",
                     help="replay groups of clusters in N processes (same results, but for the count of "
                          "events; default: one per CPU)")
    sim.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    sim.set_defaults(func=cmd_simulate)


def _out_of_range(args) -> str | None:
    """What is wrong with the numbers given, if anything."""
    if args.scale < 1 or args.jobs < 1 or args.flood < 0:
        return "--scale and --jobs must be >= 1, --flood >= 0"
    if args.spot is not None and args.spot_tier is not None:
        return "--spot puts every VM on Spot, --spot-tier only batch sessions': give one of them"
    for flag, value, ok in (("--days", args.days, lambda v: 0 < v < float("inf")),
                            ("--max-vms", args.max_vms, lambda v: v >= 1),
                            ("--share-gpus", args.share_gpus, lambda v: v >= 0),
                            ("--grace", args.grace, lambda v: 0 <= v < float("inf")),
                            ("--headroom", args.headroom, lambda v: v >= 0),
                            ("--warm-vms", args.warm_vms, lambda v: v >= 0),
                            ("--wait-probability", args.wait_probability, lambda v: 0 < v < 0.5),
                            ("--spot", args.spot, lambda v: 0 <= v < float("inf")),
                            ("--spot-tier", args.spot_tier, lambda v: 0 <= v < float("inf"))):
        if value is not None and not ok(value):
            return f"{flag} {value} is out of range"
    return None


def cmd_simulate(args) -> int:
    import json
    import time

    from provisioner.config import ConfigError
    from provisioner.sim.parallel import Run, simulate
    from provisioner.sim.parallel import results as results_of
    from provisioner.sim.trace import TraceError

    if (bad := _out_of_range(args)) is not None:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    run = Run(args.trace, args.scale, args.seed, args.clusters, args.policy, args.headroom, args.warm_vms,
              args.wait_probability, args.quotas, args.flood, args.standby, args.max_vms, args.share_gpus, args.grace,
              args.requeue, spot_preemptions_per_hour=args.spot, spot_tier=args.spot_tier, days=args.days)
    started = time.monotonic()
    shown = [0.0]

    def progress(done: float) -> None:
        now = time.monotonic()
        if now - shown[0] >= 0.2 or done >= 1.0:  # a few updates a second
            shown[0] = now
            bar = "#" * int(done * 30)
            print(f"\rsimulating [{bar:<30}] {done:6.1%}  {now - started:5.1f}s", end="", file=sys.stderr, flush=True)

    try:
        inputs = run.inputs()  # the fleet and the trace, read once for the replay and the results
        tally = simulate(run, args.jobs, progress, inputs)
    except ConfigError as e:
        print(f"error: bad fleet config:\n{e}", file=sys.stderr)
        return 1
    except (OSError, TraceError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(file=sys.stderr)
    results = {"trace": Path(args.trace).name, "scale": args.scale, "policy": args.policy or "per pool",
               **results_of(run, tally, inputs), "wall_s": round(time.monotonic() - started, 2)}
    if args.plot:
        from provisioner.sim.plot import write_plot

        try:
            write_plot(args.plot, tally.pools, f"{results['trace']} x{args.scale}, {results['policy']} policy")
        except OSError as e:
            print(f"error: cannot write the plot: {e}", file=sys.stderr)
            return 1
        print(f"plot written to {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(results))
    else:
        from provisioner.cli.render import simulation_report

        print(simulation_report(results))
    return 0
