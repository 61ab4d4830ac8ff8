"""Quotas: the pure metering and create decisions, then enforced by a real fleet over gRPC."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone

import grpc
import pytest
import yaml
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.util._once import Once

from provisioner import cli
from provisioner.cli import render
from provisioner import client as api
from provisioner.common.clock import RealClock
from provisioner.config import ConfigError, load_fleet
from provisioner.config.policy import QuotaConfig
from provisioner.rules.quota import (WEEK_S, Metered, Usage, check_create, exhaustion_time, gpu_seconds, usage,
                               week_window)
from provisioner.client.credentials import local_ca
from provisioner.cli.serve import start_front
from provisioner.v1 import admin_service_pb2 as admin_pb
from provisioner.v1 import admin_service_pb2_grpc as admin_grpc
from provisioner.v1 import session_service_pb2_grpc as s_grpc
from provisioner.v1 import session_service_pb2 as s_pb
from provisioner.v1 import types_pb2 as pb

from conftest import TIME_SCALE, fleet_config, front_channel, warm_fleet


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


# ---- the week ------------------------------------------------------------------------------

def test_the_week_resets_monday_midnight_utc_by_default():
    # 2026-11-23 is a Monday.
    assert week_window(ts("2026-11-23T00:00:00")) == (ts("2026-11-23T00:00:00"), ts("2026-11-30T00:00:00"))
    assert week_window(ts("2026-11-29T23:59:59")) == (ts("2026-11-23T00:00:00"), ts("2026-11-30T00:00:00"))
    assert week_window(ts("2026-11-25T12:00:00"))[0] == ts("2026-11-23T00:00:00")


def test_the_week_resets_on_the_configured_weekday_and_hour():
    wednesday_6 = (2, 6)
    assert week_window(ts("2026-11-25T06:00:00"), *wednesday_6)[0] == ts("2026-11-25T06:00:00")
    # The reset day, before its hour: still last week's window.
    assert week_window(ts("2026-11-25T05:59:59"), *wednesday_6) == (ts("2026-11-18T06:00:00"),
                                                                    ts("2026-11-25T06:00:00"))
    assert week_window(ts("2026-11-24T23:00:00"), *wednesday_6)[0] == ts("2026-11-18T06:00:00")


@given(st.floats(min_value=1.6e9, max_value=2.2e9), st.integers(0, 6), st.integers(0, 23))
def test_the_window_holds_now_and_is_a_week_long(now, weekday, hour):
    start, reset = week_window(now, weekday, hour)
    assert start <= now < reset and reset - start == WEEK_S
    at = datetime.fromtimestamp(start, timezone.utc)
    assert (at.weekday(), at.hour, at.minute, at.second) == (weekday, hour, 0, 0)


# ---- metering ------------------------------------------------------------------------------

WEEK = (ts("2026-11-23T00:00:00"), ts("2026-11-30T00:00:00"))
NOW = ts("2026-11-25T12:00:00")


def test_gpu_seconds_count_gpus_and_weights():
    one_hour = (NOW - 7200, NOW - 3600)
    assert gpu_seconds(Metered(1.0, *one_hour), WEEK, NOW) == 3600
    assert gpu_seconds(Metered(2.0, *one_hour), WEEK, NOW) == 7200  # a 2-GPU session
    assert gpu_seconds(Metered(2 * 0.5, *one_hour), WEEK, NOW) == 3600  # 2 GPUs weighted 0.5


def test_a_running_session_counts_until_now_and_one_that_never_ran_counts_nothing():
    assert gpu_seconds(Metered(1.0, NOW - 600, None), WEEK, NOW) == 600
    assert gpu_seconds(Metered(1.0, NOW - 600, None), WEEK, NOW + 60) == 660
    assert gpu_seconds(Metered(4.0, None, None), WEEK, NOW) == 0
    assert gpu_seconds(Metered(4.0, None, NOW - 10), WEEK, NOW) == 0  # failed while queued


def test_only_the_part_within_the_week_counts():
    across_reset = Metered(1.0, WEEK[0] - 1800, WEEK[0] + 600)
    assert gpu_seconds(across_reset, WEEK, NOW) == 600
    assert gpu_seconds(across_reset, (WEEK[0] - WEEK_S, WEEK[0]), NOW) == 1800  # the week before
    assert gpu_seconds(Metered(1.0, WEEK[0] - 3600, WEEK[0] - 60), WEEK, NOW) == 0
    # Still running at the reset: this week counts from the reset.
    assert gpu_seconds(Metered(1.0, WEEK[0] - 3600, None), WEEK, NOW) == NOW - WEEK[0]


@given(st.lists(st.tuples(st.sampled_from([0.5, 1.0, 2.0, 8.0]), st.floats(0, WEEK_S), st.floats(0, 3 * 86400),
                          st.booleans()), max_size=20),
       st.floats(0, WEEK_S))
def test_recomputing_from_the_same_records_gives_the_same_number(rows, since_start):
    """What a restarted front computes from the records equals what it computed before: nothing is
    held in memory, and splitting a session's time at the reset neither loses nor doubles any."""
    now = WEEK[0] + since_start
    sessions = [(Metered(g, WEEK[0] - 86400 + r, None if running else WEEK[0] - 86400 + r + d), "interactive", running)
                for g, r, d, running in rows]
    before = usage(sessions, now, 30 * 3600, WEEK)
    rebuilt = [(Metered(m.gpus, m.ready_at, m.ended_at), k, live) for m, k, live in sessions]
    assert usage(rebuilt, now, 30 * 3600, WEEK) == before
    previous = (WEEK[0] - WEEK_S, WEEK[0])
    for m, _, _ in sessions:
        end = now if m.ended_at is None else min(m.ended_at, now)
        whole = max(0.0, end - m.ready_at) * m.gpus
        split = gpu_seconds(m, previous, now) + gpu_seconds(m, WEEK, now)
        assert split == pytest.approx(whole, abs=1e-6)


# ---- the decision at create ----------------------------------------------------------------

def u(used_s: float, **active: int) -> Usage:
    return Usage(used_s=used_s, limit_s=3600.0, reset_time=WEEK[1], active=active)


def test_the_cap_counts_each_kind_apart():
    assert check_create(u(0, interactive=2), "interactive", 3, 60) is None
    refused = check_create(u(0, interactive=3), "interactive", 3, 60)
    assert refused.field == "max_active_sessions" and refused.reset_time is None
    assert check_create(u(0, interactive=3), "batch", 1, 60) is None
    assert check_create(u(0, interactive=3, batch=1), "batch", 1, 60).field == "max_active_sessions"


def test_a_create_needs_the_minimum_budget_left_and_is_told_the_reset():
    assert check_create(u(3600 - 60), "interactive", 4, 60) is None
    refused = check_create(u(3600 - 59), "interactive", 4, 60)
    assert refused.field == "gpu_hours_per_week" and refused.reset_time == WEEK[1]
    assert check_create(u(5000), "interactive", 4, 60).reset_time == WEEK[1]  # over, not below zero
    assert u(5000).left_s == 0


def test_the_budget_runs_out_at_the_running_sessions_rate():
    week = dict(limit_s=3600.0, reset_time=WEEK[1], active={})
    assert exhaustion_time(Usage(used_s=600, running_gpus=0.0, **week), NOW) is None  # nothing runs
    assert exhaustion_time(Usage(used_s=600, running_gpus=2.0, **week), NOW) == NOW + 1500  # 3000 s left, 2 GPUs
    assert exhaustion_time(Usage(used_s=5000, running_gpus=1.0, **week), NOW) == NOW  # already over
    # The reset comes first: the new week's budget then runs out after limit / rate.
    late = WEEK[1] - 100
    assert exhaustion_time(Usage(used_s=0, running_gpus=1.0, **week), late) == WEEK[1] + 3600
    # Too little running to use up a week's budget in a week: never.
    huge = dict(week, limit_s=WEEK_S * 2)
    assert exhaustion_time(Usage(used_s=0, running_gpus=1.0, **huge), late) is None


def test_only_sessions_running_now_set_the_rate():
    rows = [(Metered(2.0, NOW - 60, None), "interactive", True),  # running
            (Metered(4.0, NOW - 600, NOW - 60), "interactive", False),  # ended
            (Metered(8.0, None, None), "batch", True)]  # queued
    assert usage(rows, NOW, 3600, WEEK).running_gpus == 2.0


def test_quota_config_caps_per_kind_stay_backwards_compatible():
    assert QuotaConfig().max_active("batch") == QuotaConfig().max_active("interactive") == 4
    both = QuotaConfig(max_active_sessions_per_user=3)
    assert both.max_active("interactive") == both.max_active("batch") == 3
    apart = QuotaConfig(max_active_sessions_per_user={"batch": 1})
    assert (apart.max_active("interactive"), apart.max_active("batch")) == (4, 1)
    assert QuotaConfig(accelerator_weights={"nvidia-tesla-t4": 0.5}).weight("nvidia-tesla-t4") == 0.5
    assert QuotaConfig().weight("nvidia-tesla-p100") == 1.0


def test_an_override_replaces_the_budget_and_merges_caps_kind_by_kind():
    config = QuotaConfig(gpu_hours_per_week=30, max_active_sessions_per_user={"batch": 2})
    assert config.with_override({}) == config
    vip = config.with_override({"gpu_hours_per_week": 50, "max_active_sessions_per_user": {"interactive": 8}})
    assert (vip.gpu_hours_per_week, vip.max_active("interactive"), vip.max_active("batch")) == (50, 8, 2)
    assert config.with_override({"max_active_sessions_per_user": {"batch": 0}}).max_active("interactive") == 4


def test_a_bad_quota_setting_names_its_field(tmp_path):
    fleet_config(tmp_path)
    path = tmp_path / "clusters" / "fleet.yaml"
    data = yaml.safe_load(path.read_text())
    data["quotas"]["reset_hour_utc"] = 24
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as e:
        load_fleet(tmp_path / "clusters")
    assert "quotas.reset_hour_utc" in str(e.value)


# ---- enforced by the fleet -----------------------------------------------------------------

def with_quotas(tmp_path, **quotas):
    fleet_config(tmp_path)
    path = tmp_path / "clusters" / "fleet.yaml"
    data = yaml.safe_load(path.read_text())
    data["quotas"].update(quotas)
    path.write_text(yaml.safe_dump(data))
    return load_fleet(tmp_path / "clusters")


def details(err: grpc.aio.AioRpcError) -> tuple[error_details_pb2.ErrorInfo, error_details_pb2.QuotaFailure]:
    info, failure = error_details_pb2.ErrorInfo(), error_details_pb2.QuotaFailure()
    for d in rpc_status.from_call(err).details:
        if d.Is(info.DESCRIPTOR):
            d.Unpack(info)
        elif d.Is(failure.DESCRIPTOR):
            d.Unpack(failure)
    return info, failure


async def refused(fleet, **spec) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await fleet.create(**spec)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    return e.value


async def test_the_active_session_cap_holds_per_kind_and_a_stop_frees_a_slot(tmp_path):
    config = with_quotas(tmp_path, max_active_sessions_per_user={"interactive": 2, "batch": 1})
    async with warm_fleet(config, tmp_path / "data") as fleet:
        first = await fleet.create(user_id="capped", request_id="i-1")
        await fleet.create(user_id="capped", request_id="i-2")
        err = await refused(fleet, user_id="capped", request_id="i-3")
        info, failure = details(err)
        assert info.reason == "QUOTA_EXCEEDED" and "reset_time" not in info.metadata
        assert [v.subject for v in failure.violations] == ["max_active_sessions"]
        # A retry of a create already made is answered with its session, cap or not.
        assert (await fleet.create(user_id="capped", request_id="i-1")).id == first.id
        # Batch sessions are counted apart.
        await fleet.create(user_id="capped", request_id="b-1", kind=pb.SESSION_KIND_BATCH)
        await refused(fleet, user_id="capped", request_id="b-2", kind=pb.SESSION_KIND_BATCH)
        # Another user is not held back.
        await fleet.create(user_id="other", request_id="o-1")
        quota = (await fleet.sessions.GetQuota(s_pb.GetQuotaRequest(user_id="capped"))).quota
        assert (quota.active_sessions, quota.max_active_sessions) == (2, 2)
        assert (quota.active_batch_sessions, quota.max_active_batch_sessions) == (1, 1)

        await fleet.sessions.StopSession(s_pb.StopSessionRequest(session_id=first.id, reason="done"))
        await fleet.watch_until(first.id, pb.SESSION_STATE_STOPPED)
        again = await fleet.create(user_id="capped", request_id="i-3")
        assert again.id != first.id


async def test_a_user_without_budget_left_is_refused_with_the_reset_time(tmp_path):
    # 0.01 GPU hours is 36 GPU-seconds: about 0.1 s of the fleet's 300x clock.
    config = with_quotas(tmp_path, gpu_hours_per_week=0.01, min_budget_to_start_s=10)
    async with warm_fleet(config, tmp_path / "data") as fleet:
        s = await fleet.create(user_id="spender")
        await fleet.watch_until(s.id, pb.SESSION_STATE_RUNNING)
        for _ in range(1000):  # until the running session has used all but the minimum to start
            quota = (await fleet.sessions.GetQuota(s_pb.GetQuotaRequest(user_id="spender"))).quota
            if quota.gpu_hours_left * 3600 < 10:
                break
            await asyncio.sleep(0.02)
        else:
            pytest.fail(f"the budget was never used up: {quota}")
        err = await refused(fleet, user_id="spender")
        info, failure = details(err)
        assert [v.subject for v in failure.violations] == ["gpu_hours_per_week"]
        assert info.metadata["reset_time"] == quota.reset_time.ToJsonString()
        reset = quota.reset_time.ToDatetime(tzinfo=timezone.utc)
        assert (reset.weekday(), reset.hour, reset.minute) == (0, 0, 0)
        # The client library surfaces it as QuotaExceeded with the reset time, without retrying.
        async with api.AsyncClient(fleet.front_address, token=fleet.token("local-operator"),
                                   ca=local_ca(fleet.data_dir)) as c:
            with pytest.raises(api.QuotaExceeded) as e:
                await c.create_session(user_id="spender", accelerator="gpu-p100", image="gpu:latest")
            assert e.value.reset_time == reset
            # Someone else's budget is their own.
            await c.create_session(user_id="saver", accelerator="gpu-p100", image="gpu:latest")


def metered_s(ended: list[pb.Session], gpus: dict) -> float:
    """The GPU-seconds of ended sessions, from their records."""
    return sum((s.end_time.ToNanoseconds() - s.ready_time.ToNanoseconds()) / 1e9 * gpus[(s.cluster, s.pool)]
               for s in ended)


async def test_get_quota_agrees_with_the_sessions(tmp_path):
    config = with_quotas(tmp_path, accelerator_weights={"nvidia-tesla-t4": 0.5})
    gpus = {(c.name, p.name): p.accelerator_count * (0.5 if p.accelerator == "nvidia-tesla-t4" else 1.0)
            for c in config.clusters for p in c.pools}
    async with warm_fleet(config, tmp_path / "data") as fleet:
        made = [await fleet.create(user_id="meter", accelerator=a) for a in ("gpu-p100", "gpu-t4x2")]
        for s in made:
            await fleet.watch_until(s.id, pb.SESSION_STATE_RUNNING)
        clock = fleet.fleet.clusters[0].runtime.clock
        before = clock.now()
        running = (await fleet.sessions.GetQuota(s_pb.GetQuotaRequest(user_id="meter"))).quota
        after = clock.now()
        assert running.active_sessions == 2 and running.gpu_hours_used > 0
        # Projected from the moment it was asked: what is left over the two sessions' GPUs.
        rate = sum(gpus[(s.cluster, s.pool)] for s in made)
        runs_out = running.exhaustion_time.ToNanoseconds() / 1e9 - running.gpu_hours_left * 3600 / rate
        assert before - 1e-3 <= runs_out <= after + 1e-3
        for s in made:
            await fleet.sessions.StopSession(s_pb.StopSessionRequest(session_id=s.id))
            await fleet.watch_until(s.id, pb.SESSION_STATE_STOPPED)
        quota = (await fleet.sessions.GetQuota(s_pb.GetQuotaRequest(user_id="meter"))).quota
        listed = (await fleet.sessions.ListSessions(s_pb.ListSessionsRequest(user_id="meter"))).sessions
        expected_s = metered_s(listed, gpus)
        assert len(listed) == 2 and expected_s > 0
        assert quota.gpu_hours_used == pytest.approx(expected_s / 3600)
        assert quota.gpu_hours_used >= running.gpu_hours_used
        assert quota.gpu_hours_left == pytest.approx(quota.gpu_hours_limit - quota.gpu_hours_used)
        assert quota.active_sessions == 0 and not quota.HasField("exhaustion_time")
        # Ended sessions stop metering: asked again later, the same number.
        again = (await fleet.sessions.GetQuota(s_pb.GetQuotaRequest(user_id="meter"))).quota
        assert again.gpu_hours_used == quota.gpu_hours_used
        # The front now remembers those two and lists only what ended since: a third session
        # that runs and ends is counted with them, once.
        third = await fleet.create(user_id="meter", accelerator="gpu-p100")
        await fleet.watch_until(third.id, pb.SESSION_STATE_RUNNING)
        await fleet.sessions.StopSession(s_pb.StopSessionRequest(session_id=third.id))
        await fleet.watch_until(third.id, pb.SESSION_STATE_STOPPED)
        later = (await fleet.sessions.GetQuota(s_pb.GetQuotaRequest(user_id="meter"))).quota
        listed = (await fleet.sessions.ListSessions(s_pb.ListSessionsRequest(user_id="meter"))).sessions
        expected_s = metered_s(listed, gpus)
        assert len(listed) == 3 and later.gpu_hours_used == pytest.approx(expected_s / 3600)
        assert later.gpu_hours_used > quota.gpu_hours_used


# ---- operators' overrides ------------------------------------------------------------------

async def test_operators_set_a_users_limits_and_every_front_applies_them(tmp_path, capsys, monkeypatch):
    config = with_quotas(tmp_path, max_active_sessions_per_user=1)
    async with warm_fleet(config, tmp_path / "data") as fleet:
        # A second front replica on the same store.
        second = await start_front(config, RealClock(TIME_SCALE), fleet.data_dir, address="127.0.0.1:0",
                                   cluster_addresses={c.config.name: c.address for c in fleet.fleet.clusters})
        channel = fleet.front_channel()
        try:
            await second.fleet.wait_until_ready(timeout_s=10.0)
            monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
            monkeypatch.delenv("PROVISIONER_TRACES", raising=False)
            monkeypatch.setenv("PROVISIONER_DATA_DIR", str(fleet.data_dir))  # its CA and token key

            async def admin_quota(*argv: str) -> dict:
                rc = await asyncio.to_thread(cli.main, ["admin", "quota", *argv, "--json",
                                                        "--front", fleet.front_address])
                out, err = capsys.readouterr()
                assert rc == 0, err
                return json.loads(out)

            shown = await admin_quota("set", "vip", "--gpu-hours", "50", "--max-active", "interactive=3")
            assert shown["override"]["gpu_hours_per_week"] == 50 and shown["override"]["max_active_sessions"] == 3
            assert "max_active_batch_sessions" not in shown["override"]
            assert (shown["quota"]["max_active_sessions"], shown["quota"]["max_active_batch_sessions"]) == (3, 1)

            # The other replica applies it to creates and to GetQuota.
            other = s_grpc.SessionServiceStub(channel := front_channel(fleet.data_dir, second.address))
            for i in range(3):
                await other.CreateSession(s_pb.CreateSessionRequest(spec=pb.SessionSpec(
                    request_id=f"vip-{i}", user_id="vip", accelerator="gpu-p100", image="gpu:latest")), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await other.CreateSession(s_pb.CreateSessionRequest(spec=pb.SessionSpec(
                    request_id="vip-3", user_id="vip", accelerator="gpu-p100", image="gpu:latest")), timeout=10)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "at most 3" in e.value.details()
            quota = (await other.GetQuota(s_pb.GetQuotaRequest(user_id="vip"))).quota
            assert (quota.gpu_hours_limit, quota.max_active_sessions, quota.active_sessions) == (50, 3, 3)
            assert (await fleet.sessions.GetQuota(s_pb.GetQuotaRequest(user_id="other"))).quota.max_active_sessions == 1

            # Changes merge with what was set; --clear goes back to the fleet config.
            shown = await admin_quota("set", "vip", "--max-active", "2")
            assert (shown["override"]["gpu_hours_per_week"], shown["override"]["max_active_sessions"],
                    shown["override"]["max_active_batch_sessions"]) == (50, 2, 2)
            shown = await admin_quota("set", "vip", "--clear")
            assert shown["override"] == {} and shown["quota"]["max_active_sessions"] == 1
            assert (await admin_quota("show", "vip"))["quota"]["gpu_hours_limit"] == 30

            # Admins only; each change audited, reads not.
            async with fleet.front_channel(token=fleet.token("vip")) as as_user:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await admin_grpc.AdminServiceStub(as_user).SetUserQuota(
                        admin_pb.SetUserQuotaRequest(user_id="vip", max_active_sessions=100))
                assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            records = (await fleet.admin.ListAuditRecords(admin_pb.ListAuditRecordsRequest())).records
            quota_calls = [(r.rpc.rsplit("/", 1)[1], r.target, r.outcome, r.identity) for r in records
                           if "UserQuota" in r.rpc]
            # (a caller without the role is refused before its request is read: no target)
            assert quota_calls == [("SetUserQuota", "", "denied", "vip")] + \
                [("SetUserQuota", "user_id=vip", "ok", "local-operator")] * 3
        finally:
            await channel.close()
            await second.stop(0.5)


async def test_quota_limits_out_of_bounds_and_at_a_cluster_are_refused(local_fleet):
    for request, field in ((admin_pb.SetUserQuotaRequest(user_id="u", gpu_hours_per_week=-1), "gpu_hours_per_week"),
                           (admin_pb.SetUserQuotaRequest(user_id="u", max_active_sessions=-1), "max_active_sessions"),
                           (admin_pb.SetUserQuotaRequest(user_id="a/b"), "user_id"),
                           (admin_pb.SetUserQuotaRequest(), "user_id")):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await local_fleet.admin.SetUserQuota(request)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in e.value.details()
    # Quotas are the front's: a cluster refuses its quota RPCs, even to the front.
    async with local_fleet.cluster_channel("us-central1") as ch:
        for call, request in (("SetUserQuota", admin_pb.SetUserQuotaRequest(user_id="u", max_active_sessions=9)),
                              ("GetUserQuota", admin_pb.GetUserQuotaRequest(user_id="u"))):
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await getattr(admin_grpc.AdminServiceStub(ch), call)(request)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, call


def test_the_cli_shows_when_the_budget_runs_out():
    q = pb.Quota(user_id="u", gpu_hours_limit=30, gpu_hours_left=0.5)
    q.exhaustion_time.FromSeconds(int(NOW + 1800))
    assert "runs out:        2026-11-25T12:30:00Z (in 30m, at the running sessions' rate)" in render.quota_detail(q, NOW)
    assert render.quota_to_json(q)["exhaustion_time"] == "2026-11-25T12:30:00Z"
    assert "runs out" not in render.quota_detail(pb.Quota(user_id="u"), NOW)


def test_the_31st_gpu_hour_of_a_week_is_refused_with_the_reset_time():
    # The shipped quotas: 30 GPU-hours a week. A 2-GPU session ran 10 h (20) and a 1-GPU one
    # 9 h 59 min: one minute left, enough to start (60 s); at 10 h, the 31st hour is refused.
    config = QuotaConfig()
    now = ts("2026-11-27T12:00:00")
    window = week_window(now)

    def week(last_hours: float):
        runs = [(Metered(2, now - 11 * 3600, now - 3600), "interactive", False),
                (Metered(1, now - 20 * 3600, now - 20 * 3600 + last_hours * 3600), "batch", False)]
        return usage(runs, now, config.gpu_hours_per_week * 3600, window)

    assert check_create(week(10 - 1 / 60), "interactive", 4, config.min_budget_to_start_s) is None
    refused = check_create(week(10), "interactive", 4, config.min_budget_to_start_s)
    assert refused.field == "gpu_hours_per_week" and "30 GPU hours" in refused.message
    assert refused.reset_time == ts("2026-11-30T00:00:00")  # the next Monday, 00:00 UTC
