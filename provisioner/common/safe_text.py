"""Text from outside, made safe to show: what a user, a cluster or an old row stored must not move
a terminal's cursor (ESC, CSI), forge a line (LF, NEL, U+2028) or reverse what follows it (U+202E).

"Printable" is Python's `str.isprintable`: every character but those of the Unicode categories
Other (controls, formats such as the bidi overrides, surrogates, unassigned) and Separator other
than the ASCII space. Inputs that are kept (stop reasons, block reasons) must be printable; what is
shown (the CLI's tables and lines, the text log) escapes whatever is not, as Python's repr does.
"""

from __future__ import annotations


def is_printable(text: str) -> bool:
    return text.isprintable()


def printable(text: str) -> str:
    """`text` with each character that is not printable written as its escape (`\\x1b`, `\\x85`,
    `\\u2028`, `\\u202e`): one line, shown as it is stored, with nothing for a terminal to act on."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
