"""The predictive autoscaler's pieces: the arrival forecast, the warm-VM quantile, the policies
and the image target set. All pure, so tests feed them numbers and a clock."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioner.decide.autoscale import PoolSnapshot, desired_vms, plan_scale
from provisioner.decide.forecast import DAY_H, HOUR_S, RATE_MIN_HISTORY_S, Forecast, Rate, SeasonalCounts, warm_for
from provisioner.decide.prewarm_rules import holdable, next_pull, rank_images


def test_rate_follows_a_steady_stream_and_forgets_it():
    rate = Rate(half_life_s=600)
    for i in range(3600):
        rate.add(float(i))  # one a second for an hour
    assert rate.per_s(3600.0) == pytest.approx(1.0, rel=0.05)
    assert rate.per_s(3600.0 + 600) == pytest.approx(0.5, rel=0.05)  # one half-life later


def test_a_fresh_rate_reads_a_steady_stream_at_its_rate_from_the_first_minutes():
    # A cluster just started: five minutes of one arrival a second is a rate of one a second, not
    # the fifth of it that five minutes of a quarter-hour decay hold.
    rate = Rate(half_life_s=900)
    for i in range(300):
        rate.add(1_000.0 + i)
    assert rate.per_s(1_300.0) == pytest.approx(1.0, rel=0.05)
    assert rate.per_s(1_300.0 + 900) < 0.5  # a quarter hour of silence since weighs in too
    # A single arrival in the first seconds is not read as a flood.
    first = Rate(half_life_s=900)
    first.add(0.0)
    assert first.per_s(1.0) < 2 / RATE_MIN_HISTORY_S


def test_seasonal_rate_is_the_same_hour_on_earlier_days():
    counts = SeasonalCounts()
    for day in range(3):
        for k in range(120):  # 120 arrivals in hour 9 of each day, none otherwise
            counts.add(day * DAY_H * HOUR_S + 9 * HOUR_S + k * 30)
    now = 3 * DAY_H * HOUR_S + 8 * HOUR_S  # day 3, 08:00: hour 9 has not come yet today
    assert counts.per_s(now + 1.5 * HOUR_S, now) == pytest.approx(120 / HOUR_S)
    assert counts.per_s(now, now) == 0.0  # hour 8 was always quiet
    assert SeasonalCounts().per_s(now, now) == 0.0  # no history, no opinion


def test_seasonal_rate_counts_an_arrival_told_after_its_hour_was_asked_about():
    # Rates are remembered per hour until the next hour ends; an arrival reported late, in an
    # hour already complete, must still count.
    counts = SeasonalCounts()
    now = DAY_H * HOUR_S + 9 * HOUR_S + 60  # day 1, 09:01: day 0 is complete
    assert counts.per_s(now, now) == 0.0
    counts.add(9 * HOUR_S + 30)  # day 0, 09:00:30, told only now
    assert counts.per_s(now, now) == pytest.approx(1 / HOUR_S)


def test_seasonal_history_starts_when_the_forecast_does():
    # A live cluster starts at wall-clock time: days before it are unknown, not empty.
    start = 1_700_000_000.0
    counts = SeasonalCounts(since=start)
    day_s = DAY_H * HOUR_S
    hour = math.ceil(start / HOUR_S) * HOUR_S
    for k in range(60):
        counts.add(hour + k * 60)
    assert counts.per_s(hour + day_s, hour + day_s) == pytest.approx(60 / HOUR_S)


def test_forecast_rises_before_a_daily_peak_it_has_seen():
    f = Forecast()
    rng = random.Random(1)
    for day in range(3):
        t = day * DAY_H * HOUR_S + 10 * HOUR_S  # a burst of 300 arrivals from 10:00 to 11:00
        for _ in range(300):
            f.arrival(t + rng.uniform(0, HOUR_S))
    quiet = 3 * DAY_H * HOUR_S + 9.9 * HOUR_S  # day 3, 09:54, nothing has arrived for a day
    lead_s = 700.0
    assert f.warm_needed(quiet, lead_s, 0.02) >= warm_for(300 / HOUR_S * lead_s, 0.0, 0.02)
    assert f.warm_needed(quiet - 3 * HOUR_S, lead_s, 0.02) == 0


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 500.0), st.floats(0.0, 500.0), st.sampled_from([0.001, 0.01, 0.02, 0.1, 0.3]))
def test_warm_for_grows_with_arrivals_and_with_strictness(arrivals, departures, p):
    n = warm_for(arrivals, departures, p)
    assert n >= 0
    assert warm_for(arrivals + 10, departures, p) >= n
    assert warm_for(arrivals, departures, p / 2) >= n
    if arrivals > 0:
        assert n >= math.ceil(arrivals - departures - 1e-9) or departures > 0
    else:
        assert n == 0


def test_warm_for_covers_poisson_arrivals_at_the_target():
    # Simulated: warm VMs from warm_for leave at most ~p of windows short (normal approximation).
    rng = random.Random(7)
    lam = 40.0
    n = warm_for(lam, 0.0, 0.02)
    short = 0
    for _ in range(4000):
        k, t = 0, rng.expovariate(lam)
        while t < 1.0:
            k, t = k + 1, t + rng.expovariate(lam)
        short += k > n
    assert short / 4000 <= 0.03


def snap(**kw) -> PoolSnapshot:
    base = dict(warm=0, starting=0, assigned=10, recycling=0, queued=2, min_vms=1, max_vms=100,
                headroom_fraction=0.2, autoscaler="headroom", warm_vms=3, forecast_warm=7)
    return PoolSnapshot(**{**base, **kw})


def test_each_policy_adds_its_own_warm_vms_to_demand():
    assert desired_vms(snap(autoscaler="fixed")) == 12 + 3
    assert desired_vms(snap(autoscaler="headroom")) == 12 + math.ceil(12 * 0.2)
    assert desired_vms(snap(autoscaler="predictive")) == 12 + 7
    assert desired_vms(snap(autoscaler="predictive", max_vms=15)) == 15
    assert desired_vms(snap(autoscaler="fixed", assigned=0, queued=0, warm_vms=0, min_vms=2)) == 2


def test_scale_down_stops_at_the_held_size_and_at_idle_vms():
    s = snap(autoscaler="fixed", warm=10, assigned=10, queued=0)  # wants 13, has 20
    assert plan_scale(s, hold=0, idle_long_enough=10).delete == 7
    assert plan_scale(s, hold=18, idle_long_enough=10).delete == 2  # the window still wants 18
    assert plan_scale(s, hold=0, idle_long_enough=1).delete == 1  # only one idle long enough
    assert plan_scale(snap(autoscaler="fixed", starting=4), hold=0, idle_long_enough=0).launch == 15 - 14


def test_ranking_and_target_set():
    age = {"v3": 0, "v2": 1, "v1": 2}
    assert rank_images({"v1": 5.0, "v2": 0.1, "v3": 5.0}, age) == ("v3", "v1")  # tie: newer first
    layers = {"v1": {"base": 10, "a": 1}, "v2": {"base": 10, "b": 1}, "v3": {"other": 10}}
    assert holdable(("v1", "v2", "v3"), layers.__getitem__, 12) == ("v1", "v2")  # shared base counts once
    assert holdable(("v3", "v1"), layers.__getitem__, 5) == ()
    held = {"v1"}
    assert next_pull(("v1", "v2", "v3"), held.__contains__) == 1
    assert next_pull(("v1", "v2"), {"v1", "v2"}.__contains__) == 2
    assert next_pull(("v1", "v2", "v3"), set().__contains__, start=2) == 2
