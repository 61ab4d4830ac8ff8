"""What a create's quota check can decide from the front's store alone, without asking a cluster.

The store holds every session the fronts made for a user (a request's answer), when it was made,
and, once a check has listed it ended, by when it had ended; and the user's placements whose
outcome is not known yet (refused ones included, until settled: a late copy of an Allocate may
still make the session). From these, summed up by the store, an upper bound of the user's live
sessions and of the GPU time they used this week: a session not seen to end is assumed live and
running since it was made, on the largest GPU weight of the fleet. When the bound passes the
check, the real count would too, and the create asks no cluster. Only a user near a cap, with a
placement under way, or with many sessions not seen to end costs a check the clusters' lists;
that check then records the ends it saw, which keeps the bound close.

A cluster that does not list (unreachable, or too slow for the check) is counted by what the store
knows of it, not as nothing: the sessions the fronts made there for the user and have not seen end
count live (`unlisted`), so a partition cannot admit a user past their cap. The price is a user
refused while a session of theirs there may in fact have ended; the check logs it, and the front's
`provisioner_quota_checks_last_known_total` counts it by cluster. A session a cluster requeued
(below) is not in the store: unlisted, it goes uncounted.

A session the fronts did not make is one a cluster requeued after a preemption: it runs in place of
the preempted one, whose record is therefore not marked ended while a requeued session of the user
lives there.
"""

from __future__ import annotations

from provisioner.front.records import Admission, Made

REQUEUED_PREFIX = "requeue-"  # the request id of a session a cluster requeued (decide/preemption.py)


# A check lists anyway once this many of the user's sessions are not seen to end (or twice as
# many as were live at the user's last listing), to see them end: otherwise a user far from every
# limit would never be listed, and the sessions not seen to end would only grow.
LIST_AFTER = 16


def list_at(live_when_listed: int) -> int:
    """How many sessions not seen to end make a check list, given how many the user's last
    listing showed live: each listing that finds most still live doubles it, so a user with many
    live sessions is listed once in a while, not on every create."""
    return max(LIST_AFTER, 2 * live_when_listed)


def why_list(a: Admission, limit_s: float, max_active: int, min_budget_s: float, max_gpus: float,
             live_when_listed: int = 0) -> str | None:
    """Why a check must list the clusters, or None if one more session passes it whatever they
    would list: every session not seen to end counted live (of the kind asked for, whatever its
    kind), and as having run since it was made on `max_gpus`."""
    if a.placing:
        return "another create of the user is under way"
    if a.refused:
        return "a refused placement of the user is not settled"
    if a.live + 1 > max_active:
        return "near the cap on active sessions"
    if a.live >= list_at(live_when_listed):
        return "many sessions not seen to end"
    if limit_s - (a.live_s + a.ended_s) * max_gpus < min_budget_s:
        return "near the weekly GPU budget"
    return None


def ends_seen(made: list[Made], listed: list, asked_after: float) -> list[tuple[str, float]]:
    """(session id, ended by) of the made sessions at one cluster that its list shows have ended.
    `listed` answered "live, or ended at or after `asked_after`", all of it: a made session not
    listed live ended before then, or when the list says. None while a requeued session lives there."""
    live = {s.id for s in listed if not s.end_time.ToNanoseconds()}
    if any(s.spec.request_id.startswith(REQUEUED_PREFIX) for s in listed if s.id in live):
        return []
    ended = {s.id: s for s in listed if s.id not in live}
    out = []
    for m in made:
        if m.session_id in live:
            continue
        s = ended.get(m.session_id)
        if s is None:
            out.append((m.session_id, asked_after))
        elif not s.requeued_as:
            out.append((m.session_id, s.end_time.ToNanoseconds() / 1e9))
    return out


def unlisted(made: list[Made], answered: set[str], placing: frozenset[str]) -> list[Made]:
    """The made sessions not seen to end at clusters that did not list (`answered` did), less
    those already counted as placements under way: the last known of them, counted live."""
    return [m for m in made if m.cluster not in answered and m.request_id not in placing]
