"""Server commands: `up` (the local fleet in one process), `serve front|cluster`, `token`, `certificates` and
`trace`; `simulate` is in simulate_command."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

# The data dir's default is the client commands' own, so they find the fleet's CA and key wherever
# they run: $PROVISIONER_DATA_DIR, else $XDG_DATA_HOME/provisioner (~/.local/share/provisioner).
from provisioner.cli import simulate_command
from provisioner.client.credentials import default_data_dir

# The local fleet runs model time 30x faster than the wall: a 90 s boot takes 3 s and a full
# 10-minute image pull 20 s, so a demo never waits minutes (idle culling after 2 real minutes).
UP_TIME_SCALE = 30.0
# After SIGTERM, a server reports NOT_SERVING and ends its streams, then still takes calls for
# this long (wall time) before it refuses new ones: calls that arrived with the signal, or were
# sent before the senders heard of the drain, are served instead of refused.
DRAIN_SETTLE_S = 0.5
CLUSTERS_HELP = simulate_command.CLUSTERS_HELP


def register(sub: argparse._SubParsersAction) -> None:
    up = sub.add_parser("up", help="run the local fleet: the front and every cluster, on the simulated cloud")
    _common(up, UP_TIME_SCALE)
    up.add_argument("--front-address", default=None, help="where the front listens (default: fleet.yaml)")
    up.set_defaults(func=cmd_up)

    serve = sub.add_parser("serve", help="run one service of a fleet as its own process")
    kinds = serve.add_subparsers(dest="service", metavar="SERVICE", required=True)
    front = kinds.add_parser("front", help="the front router")
    _common(front, 1.0)
    front.add_argument("--address", default=None, help="where to listen (default: fleet.yaml)")
    front.add_argument("--cluster", action="append", default=[], metavar="NAME=ADDRESS",
                       help="reach a cluster at this address instead of the configured one (repeatable)")
    front.add_argument("--plaintext", action="store_true",
                       help="serve clients without TLS (loopback only; tokens are still required)")
    front.add_argument("--plaintext-anywhere", action="store_true",
                       help="with --plaintext: also on a non-loopback address, when something in front of "
                            "the front terminates TLS (a mesh sidecar, a load balancer)")
    front.set_defaults(func=cmd_serve_front)
    cluster = kinds.add_parser("cluster", help="one regional cluster provisioner")
    _common(cluster, 1.0)
    cluster.add_argument("--name", required=True, help="the cluster, as named in clusters/")
    cluster.add_argument("--address", default=None, help="where to listen (default: its clusters/ file)")
    cluster.set_defaults(func=cmd_serve_cluster)
    for p in (front, cluster):
        _tls_flags(p)
        p.add_argument("--health-address", default=os.environ.get("PROVISIONER_HEALTH_ADDRESS"), metavar="HOST:PORT",
                       help="also serve grpc.health.v1, and nothing else, in plaintext here: for probes that speak "
                            "no TLS, such as Kubernetes' gRPC probes (service '' mirrors the server's status, "
                            "'liveness' is SERVING while the process runs; env PROVISIONER_HEALTH_ADDRESS)")

    token = sub.add_parser("token", help="mint a dev token for the local fleet (signed with its key)")
    token.add_argument("--subject", default="local-operator",
                       help="the identity (default local-operator: service and admin on the local fleet; "
                            "any other name is a user of that id)")
    token.add_argument("--ttl", type=float, default=3600.0, metavar="SECONDS", help="lifetime (default 3600)")
    token.add_argument("--data-dir", default=str(default_data_dir()),
                       help="the local fleet's data dir, which holds its key (env PROVISIONER_DATA_DIR; "
                            "default ~/.local/share/provisioner)")
    token.set_defaults(func=cmd_token)

    certs = sub.add_parser("certificates", help="issue the fleet's TLS certificates from a new local CA, for a "
                                                   "first deployment (cert-manager or your CA thereafter)")
    certs.add_argument("--out", required=True, metavar="DIR", help="where to write the CA and one certificate per "
                                                                     "process (kept if present, renewed near expiry)")
    certs.add_argument("--clusters", default=None, help=CLUSTERS_HELP)
    certs.add_argument("--front-name", action="append", default=[], metavar="NAME",
                       help="another DNS name or IP address for the front's certificate, such as its internal load "
                            "balancer's (repeatable; added to security.front_tls_extra_names of fleet.yaml)")
    certs.set_defaults(func=cmd_certificates)

    trace = sub.add_parser("trace", help="show the spans of a session's requests as a tree")
    trace.add_argument("session_id")
    trace.add_argument("--file", default=None, help="span file (default: traces.jsonl in the data dir: $PROVISIONER_DATA_DIR, else "
                            "~/.local/share/provisioner)")
    trace.set_defaults(func=cmd_trace)

    simulate_command.register(sub, CLUSTERS_HELP)


def _common(p: argparse.ArgumentParser, time_scale: float) -> None:
    p.add_argument("--clusters", default=None, help=CLUSTERS_HELP)
    p.add_argument("--data-dir", default=str(default_data_dir()),
                   help="where the SQLite databases, the span file, the local CA and token key go "
                        "(env PROVISIONER_DATA_DIR; default $XDG_DATA_HOME/provisioner, i.e. ~/.local/share/provisioner)")
    p.add_argument("--time-scale", type=float, default=time_scale,
                   help=f"model seconds per wall second for the simulated cloud (default {time_scale:g})")
    p.add_argument("--database-url", default=os.environ.get("PROVISIONER_DATABASE_URL"),
                   help="postgresql://USER@HOST/DB to share state between replicas (default: SQLite files "
                        "in --data-dir; env PROVISIONER_DATABASE_URL)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--log-format", default=os.environ.get("PROVISIONER_LOG_FORMAT", "text"), choices=["text", "json"],
                   help="text, or one JSON object per line with trace and span ids (env PROVISIONER_LOG_FORMAT)")
    p.add_argument("--metrics-address", default=os.environ.get("PROVISIONER_METRICS_ADDRESS"), metavar="HOST:PORT",
                   help="serve Prometheus metrics over HTTP at http://HOST:PORT/metrics "
                        "(env PROVISIONER_METRICS_ADDRESS; default: none)")
    p.add_argument("--traces", choices=["none", "console", "otlp", "file"], default=argparse.SUPPRESS,
                   help="trace exporter (default: $PROVISIONER_TRACES, else file: <data-dir>/traces.jsonl)")
    p.add_argument("--trace-sample", type=float, default=None, metavar="RATIO",
                   help="share of new traces recorded, 0 to 1 (default: $PROVISIONER_TRACE_SAMPLE, else "
                        "tracing.sample_ratio of fleet.yaml: 1)")


def _tls_flags(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument("--tls-ca", default=env("PROVISIONER_TLS_CA"), metavar="PEM",
                   help="the CA that signs the fleet's certificates (env PROVISIONER_TLS_CA)")
    p.add_argument("--tls-cert", default=env("PROVISIONER_TLS_CERT"), metavar="PEM",
                   help="this process's certificate chain (env PROVISIONER_TLS_CERT)")
    p.add_argument("--tls-key", default=env("PROVISIONER_TLS_KEY"), metavar="PEM",
                   help="its private key (env PROVISIONER_TLS_KEY). Without the three: a local CA under "
                        "--data-dir, for a fleet on one machine")


def _tls_files(args):
    """The TLS files the flags name, or None for the local CA's."""
    from provisioner.security.pki import TlsFiles

    given = [args.tls_ca, args.tls_cert, args.tls_key]
    if not any(given):
        return None
    if not all(given):
        raise SystemExit("error: --tls-ca, --tls-cert and --tls-key go together")
    files = TlsFiles(*(Path(f) for f in given))
    for path in given:
        if not Path(path).is_file():
            raise SystemExit(f"error: no such file: {path}")
    return files


def _setup(args, service: str):
    from provisioner.observability import telemetry
    from provisioner.common.clock import fleet_clock
    from provisioner.config import ConfigError, load_fleet
    from provisioner.common.private_files import private_dir

    from provisioner.observability import logs

    logs.setup(args.log_level, args.log_format)
    try:
        fleet = load_fleet(args.clusters)
    except ConfigError as e:
        raise SystemExit(f"error: bad fleet config:\n{e}") from None
    # Everything the process writes is its owner's alone (the audit log, sessions, spans, keys).
    os.umask(0o077)
    data_dir = private_dir(args.data_dir)
    exporter = getattr(args, "traces", None) or os.environ.get("PROVISIONER_TRACES") or "file"
    try:
        ratio = telemetry.sample_ratio_from(args.trace_sample, os.environ.get(telemetry.ENV_SAMPLE)
                                            or str(fleet.settings.tracing.sample_ratio))
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    provider = telemetry.setup_tracing(service, exporter=exporter, file_path=data_dir / "traces.jsonl",
                                       sample_ratio=ratio)
    if args.time_scale <= 0:
        raise SystemExit("error: --time-scale must be > 0")
    # The fleet's model clock goes on from where its data dir says, at this process's speed.
    return fleet, data_dir, fleet_clock(data_dir, args.time_scale), provider, exporter


def _serve_until_signalled(provider, start) -> int:
    """Runs `start()` (which starts servers and returns their async stop function) until SIGTERM
    or Ctrl-C, then drains and flushes the spans."""
    from provisioner.api.server import stop_event_on_signals

    from provisioner.common.port_holder import PortTaken
    from provisioner.registry.client import RegistryError
    from provisioner.security.tls import PlaintextRefused
    from provisioner.store import StoreError

    async def run() -> None:
        stop = stop_event_on_signals()
        # Starting may wait (a standby replica waits for the lease): a signal meanwhile just exits.
        starting, stopping = asyncio.create_task(start()), asyncio.create_task(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            print("stopped before starting", file=sys.stderr)
            return
        stop_all = starting.result()
        await stopping
        print("draining: finishing in-flight requests...", file=sys.stderr)
        await stop_all()
        print("stopped", file=sys.stderr)

    try:
        asyncio.run(run())
    except (StoreError, PlaintextRefused, PortTaken) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except RegistryError as e:  # the image catalog could not be read: nothing to offer
        print(f"error: reading the image catalog: {e}", file=sys.stderr)
        return 1
    finally:
        _flush(provider)
    return 0


class _Edge:
    """What a server process offers besides its API, started before anything that may wait (a
    standby replica waits for its lease, and must answer probes and scrapes meanwhile)."""

    def __init__(self, metrics, metrics_server, health_port):
        self.metrics, self.metrics_server, self.health_port = metrics, metrics_server, health_port

    @classmethod
    async def start(cls, args) -> _Edge:
        from provisioner.api.server import HealthPort
        from provisioner.observability.metrics import Metrics

        metrics, metrics_server, health_port = Metrics(), None, None
        if args.metrics_address:
            metrics_server = await metrics.serve(args.metrics_address)
            print(f"metrics   http://{args.metrics_address.rsplit(':', 1)[0]}:{metrics_server.port}/metrics",
                  file=sys.stderr, flush=True)
        if getattr(args, "health_address", None):
            health_port = HealthPort(args.health_address)
            await health_port.start()
            print(f"health    {health_port.address} (plaintext, grpc.health.v1 only)", file=sys.stderr, flush=True)
        return cls(metrics, metrics_server, health_port)

    async def close(self) -> None:
        if self.health_port is not None:
            await self.health_port.stop()
        if self.metrics_server is not None:
            await self.metrics_server.close()


def cmd_up(args) -> int:
    from provisioner.cli.data_dir_lock import DataDirTaken, lock_data_dir

    Path(args.data_dir).mkdir(parents=True, exist_ok=True)
    try:
        lock_data_dir(Path(args.data_dir))
    except DataDirTaken as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    fleet, data_dir, clock, provider, exporter = _setup(args, "provisioner")

    async def start():
        from provisioner.cli.serve import freeze_startup_heap, start_local_fleet
        from provisioner.store import redact

        edge = await _Edge.start(args)
        local = await start_local_fleet(fleet, clock, data_dir, front_address=args.front_address,
                                        tracer_provider=provider, database_url=args.database_url,
                                        metrics=edge.metrics)
        print(f"front     {local.front.address}   (public SessionService, AdminService)")
        for c in local.clusters:
            print(f"cluster   {c.address}   {c.config.name}: "
                  f"{', '.join(p.name for p in c.config.pools)} on the simulated cloud")
        where = (f"PostgreSQL {redact(args.database_url)}" if args.database_url
                 else "SQLite: front.db, cluster-*.db; simulated cloud: sim-cloud-*.db")
        print(f"data      {data_dir}/   ({where})")
        print(f"security  {data_dir}/tls/ca.pem (the local CA), {data_dir}/auth/ (token key): the CLI uses "
              "both; provisioner token --subject NAME mints a user's token")
        if exporter == "file":
            print(f"traces    {data_dir}/traces.jsonl   (provisioner trace SESSION_ID)")
        print(f"time      x{args.time_scale:g} (model seconds per wall second)")
        freezing = freeze_startup_heap()
        # In the background, so that a signal during warm-up stops the fleet at once.
        asyncio.get_running_loop().create_task(_wait_warm(local))

        async def stop() -> None:
            freezing.close()
            await local.stop()
            await edge.close()
        return stop

    return _serve_until_signalled(provider, start)


def pool_readiness(local) -> tuple[bool, str]:
    """Whether every pool holds its minimum of VMs, counting those warm with the latest image and
    those in use by sessions (after a restart with running sessions those count too, so `ready`
    does not wait for culls), and one line saying so per pool."""
    parts, done = [], True
    for c in local.clusters:
        core = c.runtime.core
        for pool in core.pools.values():
            states = [core.vms[vid] for vid in pool.vms]
            warm = sum(1 for vm in states if vm.state.value == "warm"
                       and vm.cache.has_image(core.catalog.latest, core.catalog))
            in_use = sum(1 for vm in states if vm.state.value == "assigned")
            done &= warm + in_use >= pool.policy.min_vms
            parts.append(f"{core.name}/{pool.config.name} {warm}/{pool.policy.min_vms}"
                         + (f" (+{in_use} in use)" if in_use else ""))
    return done, "warming pools (warm VMs with the latest image / minimum): " + "  ".join(parts)


async def _wait_warm(local) -> None:
    """Shows the pools filling; the fleet takes sessions meanwhile."""
    last = ""
    for _ in range(600):
        done, line = pool_readiness(local)
        if line != last:
            print(line, file=sys.stderr, flush=True)
            last = line
        if done:
            print("ready: try  provisioner session create --user alice --accelerator gpu-p100 "
                  "--image gpu:latest --wait   (Ctrl-C stops the fleet)", flush=True)
            return
        await asyncio.sleep(0.5)


def cmd_serve_cluster(args) -> int:
    fleet, data_dir, clock, provider, _ = _setup(args, f"provisioner-cluster-{args.name}")
    tls_files = _tls_files(args)
    if args.name not in fleet.cluster_names:
        raise SystemExit(f"error: no cluster {args.name!r} in the fleet; clusters: {', '.join(fleet.cluster_names)}")

    async def start():
        from provisioner.cli.serve import freeze_startup_heap, start_cluster

        edge = await _Edge.start(args)
        proc = await start_cluster(fleet, args.name, clock, data_dir, address=args.address, tracer_provider=provider,
                                   database_url=args.database_url, tls_files=tls_files, metrics=edge.metrics,
                                   health_port=edge.health_port)
        print(f"cluster {args.name} listening on {proc.address}", flush=True)
        freezing = freeze_startup_heap()

        async def stop() -> None:
            freezing.close()
            await proc.stop(settle_s=DRAIN_SETTLE_S)
            await edge.close()
        return stop

    return _serve_until_signalled(provider, start)


def cmd_serve_front(args) -> int:
    fleet, data_dir, clock, provider, _ = _setup(args, "provisioner-front")
    tls_files = _tls_files(args)
    if args.plaintext_anywhere and not args.plaintext:
        raise SystemExit("error: --plaintext-anywhere goes with --plaintext")
    overrides = {}
    for item in args.cluster:
        name, sep, address = item.partition("=")
        if not sep or name not in fleet.cluster_names:
            raise SystemExit(f"error: --cluster wants NAME=ADDRESS with NAME one of {', '.join(fleet.cluster_names)}")
        overrides[name] = address

    async def start():
        from provisioner.cli.serve import freeze_startup_heap, start_front

        edge = await _Edge.start(args)
        proc = await start_front(fleet, clock, data_dir, address=args.address, cluster_addresses=overrides,
                                 tracer_provider=provider, database_url=args.database_url, tls_files=tls_files,
                                 plaintext=args.plaintext, plaintext_anywhere=args.plaintext_anywhere,
                                 metrics=edge.metrics, health_port=edge.health_port)
        print(f"front listening on {proc.address}", flush=True)
        freezing = freeze_startup_heap()

        async def stop() -> None:
            freezing.close()
            await proc.stop(settle_s=DRAIN_SETTLE_S)
            await edge.close()
        return stop

    return _serve_until_signalled(provider, start)


def cmd_token(args) -> int:
    from provisioner.security.client import dev_token

    if args.ttl <= 0:
        print("error: --ttl must be > 0", file=sys.stderr)
        return 2
    try:
        print(dev_token(Path(args.data_dir), args.subject, args.ttl))
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_certificates(args) -> int:
    from provisioner.config import ConfigError, load_fleet
    from provisioner.security.pki import CA_CERT, ensure_local_pki, local_files
    from provisioner.cli.serve import tls_leaves

    try:
        fleet = load_fleet(args.clusters)
    except ConfigError as e:
        print(f"error: bad fleet config:\n{e}", file=sys.stderr)
        return 1
    out = Path(args.out)
    leaves = tls_leaves(fleet)
    leaves["front"] += [n for n in args.front_name if n not in leaves["front"]]
    ensure_local_pki(out, leaves)
    print(f"CA                    {out / CA_CERT}")
    for name, dns in leaves.items():
        files = local_files(out, name)
        print(f"{name:<21} {files.cert} {files.key}   ({', '.join(dns)})")
    return 0


def cmd_trace(args) -> int:
    from provisioner.observability import traceview

    path = Path(args.file or default_data_dir() / "traces.jsonl")
    if not path.exists():
        print(f"error: no span file at {path} (run the services with --traces file)", file=sys.stderr)
        return 1
    spans = traceview.load_spans(path)
    traces = traceview.find_traces(spans, args.session_id)
    if not traces:
        print(f"error: no spans for session {args.session_id} in {path}", file=sys.stderr)
        return 1
    for trace_id in traces:
        print(traceview.render_tree(spans, trace_id))
    return 0


def _flush(provider) -> None:
    from provisioner.observability import telemetry

    telemetry.shutdown_tracing(provider)
