"""The `provisioner` command: API client commands (session, admin) and the server commands."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# gRPC's own log lines (a TLS handshake's failure, as the C core words it) are not for the terminal:
# the command says what went wrong in its own words. GRPC_VERBOSITY set by the user still wins.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import grpc  # noqa: E402 (after the verbosity, which the C core reads once)

from provisioner.agent import cli as agent_cli
from provisioner.cli import admin_commands, client, flag_order, session_commands
from provisioner.client import ProvisionerError
from provisioner.client.credentials import ca_source
from provisioner.client.errors import from_rpc_error


def _servers():
    # The server commands live apart so that client use needs none of the server code.
    try:
        return importlib.import_module("provisioner.cli.servers")
    except ModuleNotFoundError as e:
        if e.name != "provisioner.cli.servers":
            raise
        return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="provisioner", description="GPU notebook sessions from warm GPU VM pools.")
    client.add_trace_flag(parser)
    # Also before the command (`provisioner --json session list`); a flag after it works as well.
    parser.add_argument("--json", dest="json_first", action="store_true", help="machine-readable JSON on stdout")
    parser.add_argument("--front", default=argparse.SUPPRESS,
                        help=f"front address (default: $PROVISIONER_FRONT, else {client.DEFAULT_FRONT})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = client.client_flags()
    session_commands.register(sub, common)
    admin_commands.register(sub, common)
    servers = _servers()
    if servers is not None:
        servers.register(sub)
    agent_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one command; returns the exit code (1 on errors, 2 on usage errors, 130 on Ctrl-C)."""
    parser = build_parser()
    try:
        args = parser.parse_args(flag_order.hoist(parser, sys.argv[1:] if argv is None else list(argv)))
    except SystemExit as e:  # argparse exits for --help (0) and usage errors (2)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    if args.json_first:
        args.json = True
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as e:
        if (e.name or "").startswith("provisioner"):
            raise
        # A client-only install (`pip install provisioner`) has the API client, not the servers.
        print(f"error: this command needs the server's packages ({e.name} is missing): "
              "pip install 'provisioner[server]'", file=sys.stderr)
        return 1
    except (ProvisionerError, grpc.RpcError) as e:
        err = from_rpc_error(e) if isinstance(e, grpc.RpcError) else e
        trusted = ca_source(getattr(args, "ca", None), getattr(args, "data_dir", None))
        print(client.describe_error(err, client.front_address(args), trusted), file=sys.stderr)
        return 1
    except client.CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly, as other command-line tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
