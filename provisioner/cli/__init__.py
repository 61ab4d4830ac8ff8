"""The `provisioner` command: API client commands (session, admin) and the server commands."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# gRPC's own log lines (a TLS handshake's failure, as the C core words it) are not for the terminal:
# the command says what went wrong in its own words. GRPC_VERBOSITY set by the user still wins.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

from provisioner.cli import flag_order  # noqa: E402
# The API client's modules (grpc and all) are imported by the commands that use them: `simulate`,
# a replay on the simulator, runs without them (a replay's start-up is much of a short one's CPU).


def _client_error(e: Exception, args: argparse.Namespace) -> int | None:
    """An API client's error (a refused or failed call, a bad flag) reported; its exit code. None
    for any other error. Only a command that imported the client can raise one."""
    if "provisioner.cli.client" not in sys.modules:
        return None
    import grpc

    from provisioner.cli import client
    from provisioner.client import ProvisionerError
    from provisioner.client.credentials import ca_source
    from provisioner.client.errors import from_rpc_error

    if isinstance(e, (ProvisionerError, grpc.RpcError)):
        err = from_rpc_error(e) if isinstance(e, grpc.RpcError) else e
        trusted = ca_source(getattr(args, "ca", None), getattr(args, "data_dir", None))
        print(client.describe_error(err, client.front_address(args), trusted), file=sys.stderr)
        return 1
    if isinstance(e, client.CliError):
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return None


def _servers():
    # The server commands live apart so that client use needs none of the server code.
    try:
        return importlib.import_module("provisioner.cli.servers")
    except ModuleNotFoundError as e:
        if e.name != "provisioner.cli.servers":
            raise
        return None


def build_parser() -> argparse.ArgumentParser:
    from provisioner.agent import cli as agent_cli
    from provisioner.cli import admin_commands, client, session_commands

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


def simulate_parser() -> argparse.ArgumentParser:
    """The command line of `simulate` alone (the whole parser imports the API client's modules)."""
    from provisioner.cli import simulate_command

    parser = argparse.ArgumentParser(prog="provisioner")
    simulate_command.register(parser.add_subparsers(dest="command", required=True), simulate_command.CLUSTERS_HELP)
    parser.set_defaults(json_first=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one command; returns the exit code (1 on errors, 2 on usage errors, 130 on Ctrl-C)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = simulate_parser() if argv[:1] == ["simulate"] else build_parser()
    try:
        args = parser.parse_args(flag_order.hoist(parser, argv))
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
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly, as other command-line tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as e:  # noqa: BLE001 - the API client's errors, told in its words; others raise
        if (code := _client_error(e, args)) is None:
            raise
        return code
