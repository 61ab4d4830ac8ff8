"""Running a `provisioner session|admin` command: the flags each takes, its credentials, its calls
to the front (traced when tracing is installed), and the command groups of the parser. The commands
are in `session_commands` and `admin_commands`.

Human output goes to stdout as tables or `key: value` lines; progress and hints go to stderr, so
`--json` output on stdout stays machine-readable.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator

import grpc

from provisioner import client as api
from provisioner.client import _base, credentials as api_credentials
from provisioner.cli import render
from provisioner.common.safe_text import printable

DEFAULT_FRONT = _base.DEFAULT_FRONT
DEFAULT_TIMEOUT_S = _base.DEFAULT_TIMEOUT_S
TRACE_EXPORTERS = ("none", "console", "otlp", "file")


class CliError(Exception):
    """A problem found by the CLI itself; `exit_code` 2 marks a usage error."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


# How gRPC words a refused certificate: not signed by the CA trusted, or not for the name checked.
TLS_FAILURES = ("handshake failed", "certificate_verify_failed", "hostname verification")


def describe_error(err: api.ProvisionerError, front: str, trusted: str = "") -> str:
    """One line: `error: CODE: message (field ...; retry in ...)`, with a hint when the front
    cannot be reached at all: a TLS failure names the CA trusted (`trusted`) and the flags that
    choose another; otherwise nothing answers there."""
    line = f"error: {printable(str(err))}"  # the message may echo what a server was sent
    if not (isinstance(err, api.Unavailable) and err.unreachable):
        return line
    if any(words in err.message.lower() for words in TLS_FAILURES):
        return (f"error: the front at {front} answers, but its certificate was refused: this command trusts "
                f"{trusted or 'the system roots'}.\nhint: give the CA that signed the front's certificate with "
                "--ca PEM (or PROVISIONER_CA), or the fleet's data dir with --data-dir (or PROVISIONER_DATA_DIR); "
                "a local fleet's CA is <data dir>/tls/ca.pem. If the certificate does not name the address "
                "dialled, give a name it has with --server-name (or PROVISIONER_SERVER_NAME)")
    return line + (f"\nhint: nothing answers at {front}: start the local fleet with `provisioner up`, "
                   "or point --front (or PROVISIONER_FRONT) at the front")


# --- arguments -----------------------------------------------------------------------------


def enum_arg(enum) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            return render.enum_value(enum, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def add_trace_flag(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: a flag given at any level (top, group or command) survives the levels below it.
    parser.add_argument(
        "--traces", choices=TRACE_EXPORTERS, default=argparse.SUPPRESS,
        help="trace exporter (default: $PROVISIONER_TRACES, else none)")


def client_flags() -> argparse.ArgumentParser:
    """The flags of every session and admin command, at each level (group or command)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--front", default=argparse.SUPPRESS,
        help=f"front address (default: $PROVISIONER_FRONT, else {DEFAULT_FRONT})")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine-readable JSON on stdout")
    common.add_argument("--wide", action="store_true", default=argparse.SUPPRESS,
                        help="every image of a VM or pool instead of a summary; the caller's address in the audit log")
    common.add_argument("--timeout", type=positive_float, default=argparse.SUPPRESS, metavar="SECONDS",
                        help=f"deadline of each call (default {DEFAULT_TIMEOUT_S:g}; not for watches)")
    common.add_argument("--token", default=argparse.SUPPRESS,
                        help="bearer token (default: $PROVISIONER_TOKEN, else the file $PROVISIONER_TOKEN_FILE, "
                             "else a dev token from the local fleet's key in the data dir)")
    common.add_argument("--ca", default=argparse.SUPPRESS, metavar="PEM",
                        help="CA certificate to trust for the front (default: $PROVISIONER_CA, else the local "
                             "fleet's CA in the data dir if there is one, else the system's roots)")
    common.add_argument("--server-name", default=argparse.SUPPRESS, metavar="NAME",
                        help="the name to check in the front's certificate instead of the host dialled, e.g. "
                             "front.provisioner.internal when dialling a load balancer's IP address "
                             "(default: $PROVISIONER_SERVER_NAME)")
    common.add_argument("--data-dir", default=argparse.SUPPRESS,
                        help="the local fleet's data dir, for its CA and key (default: $PROVISIONER_DATA_DIR, "
                             "else $XDG_DATA_HOME/provisioner, i.e. ~/.local/share/provisioner)")
    add_trace_flag(common)
    return common


def credentials(args: argparse.Namespace) -> api.Credentials:
    """From flags, else as the client library finds them (environment, local fleet)."""
    try:
        return api_credentials.resolve(getattr(args, "token", None), getattr(args, "ca", None),
                                       getattr(args, "data_dir", None))
    except api.NoCredentials as e:
        raise CliError(e.message) from None


# --- running a command ---------------------------------------------------------------------


class Client:
    def __init__(self, channel: grpc.Channel, args: argparse.Namespace):
        self.api = api.Client(front_address(args), channel=channel,
                              timeout=getattr(args, "timeout", DEFAULT_TIMEOUT_S))
        self.json = getattr(args, "json", False)
        self.wide = getattr(args, "wide", False)

    def call(self, method: str, request):
        return self.api.call(method, request)

    def show(self, obj, text: str) -> None:
        print(json.dumps(obj, indent=2) if self.json else text, flush=True)

    def note(self, text: str) -> None:
        if not self.json:
            print(text, file=sys.stderr, flush=True)


def front_address(args: argparse.Namespace) -> str:
    return getattr(args, "front", None) or os.environ.get("PROVISIONER_FRONT") or DEFAULT_FRONT


def trace_exporter(args: argparse.Namespace) -> str:
    return getattr(args, "traces", None) or os.environ.get("PROVISIONER_TRACES") or "none"


class Tracing:
    """The CLI's tracer, if the telemetry module and OpenTelemetry are installed; otherwise every
    method is a no-op."""

    def __init__(self, exporter: str):
        self.exporter = exporter
        self.provider = None
        try:
            self._telemetry = importlib.import_module("provisioner.observability.telemetry")
        except ModuleNotFoundError as e:
            # Without the module, or with only the client's packages installed: no tracing.
            if e.name != "provisioner.observability.telemetry" and (e.name or "").startswith("provisioner"):
                raise
            return
        self.provider = self._telemetry.setup_tracing("provisioner-cli", exporter=exporter)

    def wrap(self, channel: grpc.Channel) -> grpc.Channel:
        if self.provider is None:
            return channel
        # The sync interceptor only fits OpenTelemetry's own channel wrapper, not grpc's.
        from opentelemetry.instrumentation.grpc import client_interceptor, grpcext

        return grpcext.intercept_channel(channel, client_interceptor(tracer_provider=self.provider))

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        if self.provider is None:
            yield
            return
        tracer = self.provider.get_tracer("provisioner.cli")
        with tracer.start_as_current_span(name) as span:
            try:
                yield
            finally:
                if self.exporter != "none":  # so an operator can find the trace
                    trace_id = format(span.get_span_context().trace_id, "032x")
                    print(f"trace: {trace_id}", file=sys.stderr, flush=True)

    def shutdown(self) -> None:
        if self.provider is not None:
            self._telemetry.shutdown_tracing(self.provider)


def run(name: str, handler: Callable[[Client, argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Runs one command's handler on a channel to the front, inside the command's root span."""
    tracing = Tracing(trace_exporter(args))
    try:
        creds = credentials(args)
        channel = grpc.secure_channel(front_address(args),
                                      api_credentials.front_credentials(creds.ca_pem, creds.token),
                                      options=api_credentials.server_name_options(getattr(args, "server_name", None)))
        with tracing.wrap(channel) as channel, tracing.span(f"cli {name}"):
            return handler(Client(channel, args), args)
    finally:
        tracing.shutdown()


def now() -> float:
    """The wall clock, the `now` the rendered times are relative to."""
    return time.time()


# --- command groups ------------------------------------------------------------------------


def group(subparsers, group_name: str, common, help: str):
    """A command group; returns add(name, handler, help) -> the command's parser."""
    return commands(subparsers.add_parser(group_name, parents=[common], help=help, description=help),
                    group_name, common)


def commands(p: argparse.ArgumentParser, group_name: str, common):
    """The commands of group `p` (e.g. "admin", or "admin quota"): add(name, handler, help);
    a command without a handler is a group of its own."""
    parsers = p.add_subparsers(dest=f"{group_name.replace(' ', '_')}_command", metavar="COMMAND", required=True)

    def add(name: str, handler, help: str) -> argparse.ArgumentParser:
        cmd = parsers.add_parser(name, parents=[common], help=help, description=help)
        full = f"{group_name} {name}"
        if handler is not None:
            cmd.set_defaults(func=lambda args: run(full, handler, args))
        return cmd

    return add
