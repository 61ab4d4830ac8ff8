"""A quota check from the front's store alone (front/admission.py): it passes only creates the
clusters' lists would pass too, and what a check that listed saw end is recorded for the next."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from conftest import warm_fleet
from provisioner.api import convert
from provisioner.front.admission import LIST_AFTER, ends_seen, why_list
from provisioner.front.records import Admission, Made
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import types_pb2 as pb
from test_quota import refused, with_quotas

HOUR = 3600.0


def admission(live: int = 0, live_h: float = 0.0, ended_h: float = 0.0, placing=(), refused=()) -> Admission:
    return Admission(version=3, answer=None, placing=frozenset(placing), refused=frozenset(refused), live=live,
                     live_s=live_h * HOUR, ended_s=ended_h * HOUR)


def within(a: Admission, limit_h: float = 100.0, cap: int = 3, gpus: float = 2.0) -> bool:
    return why_list(a, limit_h * HOUR, cap, 60.0, gpus) is None


def test_a_user_well_within_quota_passes_from_the_store():
    assert within(admission())
    assert within(admission(live=2, live_h=1.0, ended_h=1.0))


def test_every_session_not_seen_to_end_counts_live_whatever_its_kind():
    assert within(admission(live=2), cap=3)
    assert not within(admission(live=3), cap=3)


def test_many_sessions_not_seen_to_end_send_the_check_to_the_clusters_to_see_them_end():
    assert within(admission(live=LIST_AFTER - 1), cap=10**9)
    assert not within(admission(live=LIST_AFTER), cap=10**9)
    # A listing that showed 20 live: the next lists at 40 not seen to end, not on every create.
    assert why_list(admission(live=39), 100 * HOUR, 10**9, 60.0, 2.0, live_when_listed=20) is None
    assert why_list(admission(live=40), 100 * HOUR, 10**9, 60.0, 2.0, live_when_listed=20) is not None


def test_a_check_that_lists_says_why():
    def why(a: Admission, cap: int = 3) -> str | None:
        return why_list(a, 100 * HOUR, cap, 60.0, 2.0)

    assert why(admission()) is None
    assert why(admission(placing={"r-other"})) == "another create of the user is under way"
    assert why(admission(refused={"r-other"})) == "a refused placement of the user is not settled"
    assert why(admission(live=3)) == "near the cap on active sessions"
    assert why(admission(live=LIST_AFTER), cap=10**9) == "many sessions not seen to end"
    assert why(admission(live=1, live_h=40.0, ended_h=10.0)) == "near the weekly GPU budget"


def test_a_placement_under_way_elsewhere_sends_the_check_to_the_clusters():
    assert not within(admission(placing={"r-other"}))
    assert not within(admission(refused={"r-other"}))  # a late copy of its Allocate may still make it


def test_the_time_made_sessions_may_have_run_counts_on_the_largest_gpus():
    # 2 GPUs x 24 h: 48 of the budget's GPU hours; a session needs a minute more to start.
    assert within(admission(live=1, live_h=24.0), limit_h=48.1)
    assert not within(admission(live=1, live_h=24.0), limit_h=48.0)
    assert not within(admission(ended_h=24.0), limit_h=48.0)
    assert within(admission(live=1, live_h=12.0, ended_h=12.0), limit_h=48.1)


def made(sid: str) -> Made:
    return Made(f"r-{sid}", sid, "us", 1.0)


def session(sid: str, request: str = "", ended: float = 0.0, requeued_as: str = "") -> pb.Session:
    s = pb.Session(id=sid, spec=pb.SessionSpec(request_id=request or f"r-{sid}"), requeued_as=requeued_as)
    if ended:
        s.end_time.CopyFrom(convert.timestamp(ended))
    return s


def test_a_list_shows_which_made_sessions_ended_and_by_when():
    mine = [made("live"), made("gone"), made("just")]
    listed = [session("live"), session("just", ended=40.0)]
    # Not listed and not live: it ended before what the list asked for (30).
    assert sorted(ends_seen(mine, listed, asked_after=30.0)) == [("gone", 30.0), ("just", 40.0)]


def test_no_end_is_recorded_while_a_requeued_session_runs_in_place_of_a_made_one():
    mine = [made("preempted")]
    assert ends_seen(mine, [session("preempted", ended=40.0, requeued_as="us.s-2")], 30.0) == []
    assert ends_seen(mine, [session("us.s-2", request="requeue-preempted")], 30.0) == []
    # Once the requeued one ended too, nothing runs in its place.
    assert ends_seen(mine, [session("us.s-2", request="requeue-preempted", ended=45.0)], 30.0) == [("preempted", 30.0)]


def quota_checks(exporter: InMemorySpanExporter) -> list[str]:
    """For each create, in order: "store" if its quota check asked no cluster, else "listed"."""
    creates = [s for s in exporter.get_finished_spans()
               if s.name == "/provisioner.v1.SessionService/CreateSession" and s.kind.name == "SERVER"]
    return ["store" if any(e.name == "quota: within, from the store" for e in s.events) else "listed"
            for s in sorted(creates, key=lambda s: s.start_time)]


@pytest.mark.timeout(60)
async def test_creates_within_quota_ask_no_cluster_and_a_check_that_listed_teaches_the_next(tmp_path):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = with_quotas(tmp_path, max_active_sessions_per_user=3)
    async with warm_fleet(config, tmp_path / "data", tracer_provider=provider) as fleet:
        for i in (1, 2):
            s = await fleet.create(user_id="ada", request_id=str(i))
            await fleet.sessions.StopSession(s_pb.StopSessionRequest(session_id=s.id, reason="done"))
            await fleet.watch_until(s.id, pb.SESSION_STATE_STOPPED)
        await fleet.create(user_id="ada", request_id="3")  # two not seen to end, plus this one: 3
        await fleet.create(user_id="ada", request_id="4")  # would be 4: listed, sees 1 and 2 ended
        await fleet.fleet.front.sessions.flush()  # their ends recorded
        await fleet.create(user_id="ada", request_id="5")  # 3 and 4, plus this one
        await refused(fleet, user_id="ada", request_id="6")  # at the cap: the lists say so
        assert quota_checks(exporter) == ["store", "store", "store", "listed", "store", "listed"]

