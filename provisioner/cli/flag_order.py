"""Flags anywhere on the command line: `provisioner --user alice session list` means
`provisioner session list --user alice`. argparse takes a flag only at the level that defines it,
so flags given before the command that defines them are moved after it."""

from __future__ import annotations

import argparse


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def _takes_value(parser: argparse.ArgumentParser, flag: str) -> bool | None:
    """Whether `flag` takes a value at this level; None when the level does not know it."""
    action = parser._option_string_actions.get(flag)
    return None if action is None else action.nargs != 0


def hoist(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`argv` with each flag that a level before the last command does not know moved to the end
    (with its value), where the command's own parser reads it. Anything else stays in place."""
    out, moved, i = [], [], 0
    level = parser
    while i < len(argv):
        token = argv[i]
        subs = _subcommands(level)
        if not subs or token == "--":
            break
        if token in subs:
            out.append(token)
            level = subs[token]
        elif token.startswith("-") and token != "-":
            flag, has_value = token.split("=", 1)[0], "=" in token
            known = _takes_value(level, flag)
            if known is not None:
                takes = known and not has_value
            else:  # an unknown flag's value is the next word, unless that word is the next command
                takes = (not has_value and i + 1 < len(argv) and not argv[i + 1].startswith("-")
                         and argv[i + 1] not in subs)
            (out if known is not None else moved).extend(argv[i:i + 1 + takes])
            i += takes
        else:
            break  # a positional argument where a command was expected: argparse reports it
        i += 1
    return out + argv[i:] + moved
