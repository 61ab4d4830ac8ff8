"""`python -m provisioner.agent`: the same as `provisioner agent`."""
import argparse
import sys

from provisioner.agent import cli


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m provisioner.agent")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["agent", *argv])
    return args.func(args)


sys.exit(main(sys.argv[1:]))
