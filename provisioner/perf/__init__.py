"""Benchmarks, each `python -m provisioner.perf.NAME`: `serving` (the front and a cluster against
a raw grpc.aio echo, as separate processes; `echo`, `fleet` and `load` are its parts), `phases`
(where a create's time goes, from a span file), `commits` (the store's durable writes with and
without group commit), `history` (the front's store work as history grows), `restart` (a cluster
restarting with a long history), `queue` (the core under a burst that queues, then leaves),
`watchers` (what the watches of a long queue cost a cluster as its head leaves), `gcpause` (a
full garbage collection with a cluster's restored state, before and after gc.freeze),
`auth_overhead` (what TLS and token checks cost a warm create), `floods` (a user's creates beside
floods of other callers), `replay` (the simulator's CPU per replayed session across commits) and
`tables` (the docs' results tables, rendered from benchmark output)."""


from __future__ import annotations

import shlex
import sys


def command(module: str, argv: list[str] | None) -> str:
    """The command that ran benchmark `module` with `argv` (default: this process's), `--json`
    left out: what a results table shows beside the figures it made."""
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", "-m", module, *(a for a in args if a != "--json")])
