"""Offset pages of list answers (api/paging.py)."""

from __future__ import annotations

from provisioner.api.paging import MAX_BRIEF_PAGE_SIZE, page


def test_pages_hold_500_at_most_and_brief_ones_for_fronts_5000():
    items = list(range(12_000))
    assert page(items, 10_000, "") == (items[:500], "500")
    first, token = page(items, 10_000, "", MAX_BRIEF_PAGE_SIZE)
    assert first == items[:5000] and page(items, 10_000, token, MAX_BRIEF_PAGE_SIZE)[0] == items[5000:10_000]


async def test_a_front_reads_every_page_of_a_cluster_s_list_pausing_between_pages_if_asked(monkeypatch):
    import asyncio
    from types import SimpleNamespace

    from provisioner.front import listing
    from provisioner.v1 import cluster_service_pb2 as cluster_pb
    from provisioner.v1 import types_pb2 as pb

    sessions = [pb.Session(id=f"s{i}") for i in range(7)]

    async def list_sessions(request, timeout=None):
        items, token = page(sessions, request.page_size, request.page_token)
        return cluster_pb.ListResponse(sessions=items, next_page_token=token)

    pauses: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds):
        pauses.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(listing.asyncio, "sleep", sleep)
    cluster = SimpleNamespace(sessions=SimpleNamespace(List=list_sessions))
    got = await listing.listed(cluster, cluster_pb.ListRequest(), None, page_size=3, pause_s=0.02)
    assert [s.id for s in got] == [s.id for s in sessions]
    assert pauses == [0.02, 0.02]  # between the three pages, not after the last
    pauses.clear()
    assert len(await listing.listed(cluster, cluster_pb.ListRequest(), None, page_size=3)) == 7
    assert pauses == []
