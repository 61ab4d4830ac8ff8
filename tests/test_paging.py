"""Offset pages of list answers (api/paging.py)."""

from __future__ import annotations

from provisioner.api.paging import MAX_BRIEF_PAGE_SIZE, page


def test_pages_hold_500_at_most_and_brief_ones_for_fronts_5000():
    items = list(range(12_000))
    assert page(items, 10_000, "") == (items[:500], "500")
    first, token = page(items, 10_000, "", MAX_BRIEF_PAGE_SIZE)
    assert first == items[:5000] and page(items, 10_000, token, MAX_BRIEF_PAGE_SIZE)[0] == items[5000:10_000]
