"""Keyset pages of session lists (api/keyset.py): a cluster's page costs a page however many
sessions it keeps, and the front merges the clusters' pages into one, its token carrying each
cluster's position."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest
import yaml

from conftest import fleet_config, quick_warm_up, warm_fleet
from core_driver import make_core
from provisioner.api import keyset
from provisioner.api.keyset import Part, merge
from provisioner.api.paging import page_size
from provisioner.common.clock import ManualClock
from provisioner.cloud.sim import SimCloud
from provisioner.cluster.listing import Filter
from provisioner.cluster.runtime import ClusterRuntime
from provisioner.config import load_fleet
from provisioner.model.errors import InvalidArgument
from provisioner.model.records import SessionSpec, SessionState, created_ns
from provisioner.store import SqliteStore, open_store
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import types_pb2 as pb

CLUSTERS = ("us-central1", "europe-west4", "asia-east1")


# ---- merging pages, pure --------------------------------------------------------------------

def _answer(rows: list, position, limit: int, walk: int) -> Part:
    """A source holding `rows` (keys, in list order) answering "after position": up to `limit`
    rows, walking at most `walk` rows (some of which a filter drops: odd ids)."""
    after = [k for k in rows if position is None or k < position]
    found, examined = [], 0
    for k in after[:walk]:
        examined += 1
        if k[1] % 2 == 0:
            found.append(k)
        if len(found) == limit:
            break
    return Part(found, after[examined - 1] if 0 < examined < len(after) else None)


@pytest.mark.parametrize("seed", range(40))
def test_pages_merged_from_sources_give_every_row_once_in_order(seed):
    rnd = random.Random(seed)
    keys = rnd.sample(range(10_000), rnd.randint(0, 300))
    sources = [sorted((k for k in keys if k % 3 == i), reverse=True) for i in range(3)]
    sources = [[(k // 7, k) for k in s] for s in sources]  # ties of time, told apart by id
    want = sorted((k for s in sources for k in s if k[1] % 2 == 0), reverse=True)
    positions, got, pages = [None] * 3, [], 0
    asked = [0, 1, 2]
    while asked:
        limit = rnd.randint(1, 20)
        parts = [_answer(sources[i], positions[i], limit, rnd.randint(1, 30)) for i in asked]
        rows, following = merge(parts, lambda k: k, limit)
        assert len(rows) <= limit
        got += rows
        positions = [None] * 3
        for i, p in zip(asked, following):
            positions[i] = p
        asked = [i for i, p in zip(asked, following) if p is not None]
        pages += 1
        assert pages < 2000
    assert got == want


def test_page_size_is_bounded():
    assert page_size(0) == 50 and page_size(7) == 7 and page_size(10**9) == 500
    with pytest.raises(InvalidArgument):
        page_size(-1)


def test_tokens_that_were_not_issued_are_refused_with_a_clear_message():
    query = keyset.query_fingerprint("ada", [])
    good = keyset.encode_positions(query, {"us-central1": (5, "us-central1.s-00ff"), "asia-east1": None})
    assert keyset.decode_positions(good, query, CLUSTERS) == {"us-central1": (5, "us-central1.s-00ff"),
                                                              "asia-east1": None}
    bad = ["x", "!!", good[:-3], keyset.encode_position((5, "us-central1.s-00ff")),
           keyset.encode_positions(query, {"mars-north1": None}),
           keyset.encode_positions(query, {"us-central1": (-1, "us-central1.s-00ff")}),
           keyset.encode_positions(query, {"us-central1": (5, "../etc")})]
    for token in bad:
        with pytest.raises(InvalidArgument, match="page_token is not a page token this service issued"):
            keyset.decode_positions(token, query, CLUSTERS)
    with pytest.raises(InvalidArgument, match="belongs to another listing"):
        keyset.decode_positions(good, keyset.query_fingerprint("bob", []), CLUSTERS)
    assert keyset.decode_position(keyset.encode_position((5, "us-central1.s-00ff"))) == (5, "us-central1.s-00ff")
    for token in ["5", "eA", good]:
        with pytest.raises(InvalidArgument):
            keyset.decode_position(token)


# ---- a cluster's page ------------------------------------------------------------------------

async def _cluster_with(tmp_path, sessions: int) -> ClusterRuntime:
    """A cluster whose user ada made `sessions` sessions, three in four stopped and past the
    retention period (in the store only), the others in memory."""
    core = make_core(min_vms=0, sessions={"retention_s": 60.0})
    clock = ManualClock(start=1_000.0)
    rt = ClusterRuntime(core, SimCloud(core.config.sim, clock, tracer=None, record_calls=False), clock,
                        SqliteStore(tmp_path / f"c{sessions}.db"))
    await rt.start()
    for i in range(sessions):
        s = rt.allocate(SessionSpec(f"r{i}", "ada", "gpu-p100", "gpu:latest"))
        if i % 4:
            rt.stop(s.id, "done")
        await clock.advance(1.0)
    await rt.writer.durable()
    await clock.advance(600)  # the stopped ones leave memory
    return rt


async def _every_page(rt: ClusterRuntime, want: Filter, limit: int) -> tuple[list, list[int]]:
    got, costs, position = [], [], None
    while True:
        before = rt.reads.index.rows_read
        rows, position = rt.reads.list_page("ada", want, position, limit)
        costs.append(rt.reads.index.rows_read - before)
        got += rows
        if position is None:
            return got, costs


async def test_a_page_reads_about_a_page_of_rows_however_many_sessions_the_cluster_keeps(tmp_path):
    costs = {}
    for n in (40, 1200):
        rt = await _cluster_with(tmp_path, n)
        try:
            every = sorted(rt.store.sessions.load_sessions("us-central1"), key=lambda s: (created_ns(s.created_at), s.id),
                           reverse=True)
            assert len(every) == n and sum(s.id in rt.core.sessions for s in every) < n / 2
            got, _ = await _every_page(rt, Filter(), 10)
            assert [s.id for s in got] == [s.id for s in every]  # memory and store merged, in order
            # (a session that left memory is walked past once, by the first page that meets it)
            again, page_costs = await _every_page(rt, Filter(), 10)
            assert again == got
            costs[n] = page_costs[0]
            stopped, _ = await _every_page(rt, Filter(frozenset({SessionState.STOPPED})), 25)
            assert [s.id for s in stopped] == [s.id for s in every if s.state.value == "stopped"]
            window = Filter(created_after=created_ns(every[30].created_at), created_before=created_ns(every[5].created_at))
            inside, _ = await _every_page(rt, window, 7)
            assert [s.id for s in inside] == [s.id for s in every[6:31]]
        finally:
            await rt.close()
    # the first page: 10 rows from memory and 10 from the store at most, whatever the total
    assert costs[40] <= 20 and costs[1200] <= 20, costs


def test_a_page_of_old_sessions_is_a_range_of_an_index_in_sqlite(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'plan.db'}", tmp_path / "unused.db")
    try:
        statements: list[str] = []
        s._db.set_trace_callback(statements.append)
        s.sessions.user_sessions_page("c1", "ada", (5_000, "c1.s-00ff"), 100, 9_000, 50)
        s._db.set_trace_callback(None)
        query = next(q for q in statements if q.startswith("SELECT body"))
        plan = " | ".join(row[-1] for row in s.rows(f"EXPLAIN QUERY PLAN {query}"))
    finally:
        s.close()
    assert "sessions_user_created (cluster=? AND user_id=? AND (created_ns,id)<(?,?)" in plan \
        or "sessions_user_created (cluster=? AND user_id=? AND created_ns>? AND (created_ns,id)<(?,?))" in plan, plan
    assert "TEMP B-TREE" not in plan, plan  # the index gives the order: no sort of the user's history


def test_a_page_of_old_sessions_is_a_range_of_an_index_in_postgresql(postgres, tmp_path):
    s = open_store(postgres.new_database(), tmp_path / "unused.db")
    try:
        with s.transaction() as cur:  # enough history for the planner to prefer an index
            cur.executemany(s.sql("INSERT INTO sessions (id, cluster, request_id, user_id, state, revision, ended_at, "
                                   "created_ns, body) VALUES (?, 'c1', ?, ?, 'stopped', 1, 1.0, ?, '{}')"),
                            [(f"c1.s-{i:06x}", f"u{i % 200}/r{i}", f"u{i % 200}", i * 1000) for i in range(20_000)])
            cur.execute("ANALYZE sessions")
        rows = s.rows("EXPLAIN SELECT body FROM sessions WHERE cluster = 'c1' AND user_id = 'u7' AND "
                       "(created_ns, id) < (15000000, 'c1.s-ffffff') AND state NOT IN ('queued', 'running') "
                       "ORDER BY created_ns DESC, id DESC LIMIT 50")
    finally:
        s.close()
    plan = " | ".join(r[0] for r in rows)
    assert "Index Scan Backward using sessions_user_created" in plan, plan
    assert "Sort" not in plan, plan


# ---- the front's page, across clusters -------------------------------------------------------

@pytest.fixture
async def three_clusters(tmp_path):
    """The local fleet (three clusters), stopped sessions leaving memory a model minute after they
    end (0.2 s of wall time), and room for many live sessions per user."""
    fleet_config(tmp_path, quick_warm_up)
    path = tmp_path / "clusters" / "fleet.yaml"
    data = yaml.safe_load(path.read_text())
    data["sessions"]["retention_s"] = 60
    data["quotas"]["max_active_sessions_per_user"] = 100
    path.write_text(yaml.safe_dump(data))
    async with warm_fleet(load_fleet(tmp_path / "clusters"), tmp_path / "data") as handle:
        yield handle


async def _page(fleet, **request) -> s_pb.ListSessionsResponse:
    return await fleet.sessions.ListSessions(s_pb.ListSessionsRequest(user_id="ada", **request), timeout=10)


async def test_pages_across_three_clusters_give_each_session_once_newest_first(three_clusters):
    fleet = three_clusters
    made = []
    for i in range(12):
        s = await fleet.create(user_id="ada", region_hint=CLUSTERS[i % 3], region_required=True)
        made.append(s)
        if i % 2:
            await fleet.sessions.StopSession(s_pb.StopSessionRequest(session_id=s.id), timeout=10)
    await asyncio.sleep(1.0)  # the stopped ones are past the retention period: the store's
    seen, token, later = [], "", []
    while True:
        resp = await _page(fleet, page_size=5, page_token=token)
        assert len(resp.sessions) <= 5
        seen += resp.sessions
        if not resp.next_page_token:
            break
        token = resp.next_page_token
        # sessions made between pages sort before the position: not on a later page
        later.append(await fleet.create(user_id="ada", region_hint=CLUSTERS[len(later) % 3], region_required=True))
    assert later and {s.cluster for s in seen} == set(CLUSTERS)
    assert [s.id for s in seen] == [s.id for s in sorted(made, key=lambda s: (s.create_time.ToNanoseconds(), s.id),
                                                         reverse=True)]
    assert not any(s.history for s in seen)  # histories only when asked
    whole = await _page(fleet, page_size=100, with_history=True)
    assert {s.id for s in whole.sessions} == {s.id for s in made + later} and all(s.history for s in whole.sessions)
    live = await _page(fleet, page_size=100, states=[pb.SESSION_STATE_QUEUED, pb.SESSION_STATE_PROVISIONING,
                                                     pb.SESSION_STATE_PULLING_IMAGE, pb.SESSION_STATE_STARTING,
                                                     pb.SESSION_STATE_RUNNING])
    assert {s.id for s in live.sessions} == {s.id for i, s in enumerate(made) if i % 2 == 0} | {s.id for s in later}


async def test_a_bad_token_or_page_size_is_invalid_argument(three_clusters):
    fleet = three_clusters
    for i in range(3):
        await fleet.create(user_id="ada", region_hint=CLUSTERS[i], region_required=True)
    first = await _page(fleet, page_size=1)
    assert first.next_page_token
    bad = [dict(page_token="bm90IGEgdG9rZW4"), dict(page_token=first.next_page_token[:-4]),
           dict(page_token=first.next_page_token, states=[pb.SESSION_STATE_RUNNING]),  # another query's
           dict(page_size=-1)]
    for request in bad:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _page(fleet, **request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, request
        assert "page" in info.value.details(), info.value.details()
    assert len((await _page(fleet, page_size=2**31 - 1)).sessions) == 3  # more than 500 means 500
