"""What a front remembers of users' ended sessions (front/ended_sessions.py), so that a quota
check asks each cluster only for what changed since the last one."""

from __future__ import annotations

from provisioner.front.ended_sessions import CLOCK_MARGIN_S, EndedSessions
from provisioner.rules.quota import Metered, Row

WEEK = 1_000.0


def ended(sid: str, ready: float, end: float, request: str = "") -> tuple[str, float, Row]:
    return sid, end, Row(Metered(1.0, ready, end), "interactive", request or f"r-{sid}")


def test_a_user_never_seen_is_asked_for_the_whole_week_then_only_since_the_latest_end():
    seen = EndedSessions()
    assert seen.ask_after("ada", "us", WEEK) == WEEK
    seen.add("ada", "us", [ended("s1", 1_100, 1_500), ended("s2", 1_200, 5_000)])
    assert seen.ask_after("ada", "us", WEEK) == 5_000 - CLOCK_MARGIN_S  # less a margin for clock steps
    assert seen.ask_after("ada", "eu", WEEK) == WEEK  # each cluster on its own
    assert seen.ask_after("bob", "us", WEEK) == WEEK


def test_a_session_listed_again_is_counted_once():
    seen = EndedSessions()
    seen.add("ada", "us", [ended("s1", 1_100, 5_000)])
    seen.add("ada", "us", [ended("s1", 1_100, 5_000), ended("s3", 4_000, 5_010)])  # within the margin, again
    assert sorted(r.request_id for r in seen.rows("ada", "us", WEEK)) == ["r-s1", "r-s3"]


def test_sessions_that_ended_before_the_week_are_dropped_and_a_new_week_asks_from_its_start():
    seen = EndedSessions()
    seen.add("ada", "us", [ended("s1", 1_100, 1_500), ended("s2", 3_000, 9_000)])
    assert [r.request_id for r in seen.rows("ada", "us", 2_000)] == ["r-s2"]
    assert seen.ask_after("ada", "us", 20_000) == 20_000


def test_the_users_checked_longest_ago_are_forgotten_first_and_read_whole_again():
    seen = EndedSessions(max_users=2)
    seen.add("ada", "us", [ended("a", 1_100, 2_000)])
    seen.add("bob", "us", [ended("b", 1_100, 2_000)])
    seen.add("ada", "us", [])  # ada checked again: bob is now the oldest
    seen.add("cy", "us", [ended("c", 1_100, 2_000)])
    assert seen.rows("bob", "us", WEEK) == [] and seen.ask_after("bob", "us", WEEK) == WEEK
    assert [r.request_id for r in seen.rows("ada", "us", WEEK)] == ["r-a"]


def test_a_list_of_every_user_carries_forward_only_users_known_without_a_gap():
    seen = EndedSessions()
    seen.add("ada", "us", [ended("a1", 1_100, 1_500)], asked_at=2_000)  # known up to 2,000
    seen.add("bob", "us", [ended("b1", 1_100, 1_500)], asked_at=1_000)  # known up to 1,000 only
    # A list of every user's sessions on "us" that holds every end since 1,800, asked at 3,000.
    seen.extend("us", 1_800, 3_000, {"ada": [ended("a2", 2_000, 2_500)], "bob": [ended("b2", 2_000, 2_600)],
                                     "cy": [ended("c1", 2_000, 2_700)]})
    assert seen.covered("ada", "us") == 3_000
    assert sorted(r.request_id for r in seen.rows("ada", "us", WEEK)) == ["r-a1", "r-a2"]
    assert seen.ask_after("ada", "us", WEEK) == 3_000 - CLOCK_MARGIN_S
    # bob's ends between 1,000 and 1,800 are unknown: left as he was, to be listed on his own.
    assert seen.covered("bob", "us") == 1_000
    assert [r.request_id for r in seen.rows("bob", "us", WEEK)] == ["r-b1"]
    # cy was never listed: nothing of his week before 1,800 is known.
    assert seen.covered("cy", "us") == float("-inf") and seen.rows("cy", "us", WEEK) == []
    assert seen.covered("ada", "eu") == float("-inf")  # each cluster on its own
