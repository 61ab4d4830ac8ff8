"""The freezer moves what a slow full collection kept out of the collector's way, and only then."""

from __future__ import annotations

import gc

from provisioner.common.gc_freeze import LongLivedFreezer


class Node:
    def __init__(self):
        self.children: list = []


def test_a_slow_full_collection_that_freed_nothing_freezes_what_it_kept():
    gc.collect()
    kept = [Node() for _ in range(50_000)]  # long-lived state, no garbage
    before = gc.get_freeze_count()
    try:
        with LongLivedFreezer(slow_s=0.0) as freezer:
            gc.collect()
            assert freezer.freezes == 1 and gc.get_freeze_count() >= before + len(kept)
            # What was frozen is still freed by reference counting.
            del kept[:]
    finally:
        gc.unfreeze()


def cycle() -> Node:
    a, b = Node(), Node()
    a.children.append(b)
    b.children.append(a)
    return a


def test_a_full_collection_that_freed_much_or_was_quick_freezes_nothing():
    garbage = [cycle() for _ in range(50_000)]
    gc.collect()  # old by now: only a full collection can free it
    del garbage
    with LongLivedFreezer(slow_s=0.0) as freezer:
        assert gc.collect() >= 100_000
        assert freezer.freezes == 0
    with LongLivedFreezer(slow_s=60.0) as freezer:
        gc.collect()
        assert freezer.freezes == 0
