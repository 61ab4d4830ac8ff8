"""SQL helpers the repositories share: a set of states as a statement's placeholders and their
arguments, in one order."""


def values(states) -> list[str]:
    return sorted(s.value for s in states)


def marks(states) -> str:
    return ", ".join("?" * len(states))
