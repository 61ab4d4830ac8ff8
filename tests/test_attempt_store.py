"""The store's side of the front's attempt table, against SQLite and a real PostgreSQL server: the
edges it applies in SQL are the table's, and a change the machine chose lands only on the row it
was decided from."""

from __future__ import annotations

import pytest

from provisioner.front.attempts import TRANSITIONS, Attempt, Event, IllegalAttemptChange
from provisioner.front.records import FrontRecords
from provisioner.store import open_store


@pytest.fixture
def store(store_url, tmp_path):
    s = open_store(store_url, tmp_path / "unused.db")
    yield s
    s.close()


def state(store, key: str, cluster: str = "c1") -> Attempt | None:
    with store.reading() as cur:
        cur.execute(store.sql("SELECT outcome FROM front_attempts WHERE request_id = ? AND cluster = ?"), (key, cluster))
        row = cur.fetchone()
    return Attempt(row[0]) if row else None


def put(store, key: str, to: Attempt | None) -> None:
    """An attempt in state `to`, reached through the table's own edges."""
    if to is None:
        return
    FrontRecords(store).note_attempt(key, "c1", 100.0)
    if to is Attempt.MADE:
        FrontRecords(store).remember_request(key, f"c1.s-{key}", "c1", 1.0)
    elif to is not Attempt.PENDING:
        via = {Attempt.UNRESOLVED: Attempt.UNRESOLVED, Attempt.REFUSED: Attempt.REFUSED, Attempt.NONE: Attempt.REFUSED}
        assert FrontRecords(store).settle_attempt(key, "c1", via[to])
        if to is Attempt.NONE:
            assert FrontRecords(store).settle_attempt(key, "c1", Attempt.NONE, expected=Attempt.REFUSED, commit_by=100.0)


@pytest.mark.parametrize("before", [None, *Attempt], ids=lambda s: str(s or "absent"))
def test_sending_takes_the_tables_edge_from_every_state(store, before):
    key = f"k-{before}"
    put(store, key, before)
    after = FrontRecords(store).note_attempt(key, "c1", 150.0).state
    assert after == TRANSITIONS.get((before, Event.SENT), before)  # a made attempt stays made
    assert state(store, key) == after
    if after is Attempt.PENDING:
        assert FrontRecords(store).open_attempts(key) == [(key, "c1", 150.0)]  # the later commit_by
        FrontRecords(store).note_attempt(key, "c1", 120.0)
        assert FrontRecords(store).open_attempts(key) == [(key, "c1", 150.0)]


def test_a_chosen_change_lands_only_on_the_row_it_was_decided_from(store):
    FrontRecords(store).note_attempt("r1", "c1", 100.0)
    assert not FrontRecords(store).settle_attempt("r1", "c1", Attempt.NONE, expected=Attempt.UNRESOLVED)  # it is pending
    assert FrontRecords(store).settle_attempt("r1", "c1", Attempt.REFUSED, expected=Attempt.PENDING)
    # The resolver decided on (refused, 100.0); another front sends again meanwhile (later commit_by).
    FrontRecords(store).note_attempt("r1", "c1", 130.0)
    assert not FrontRecords(store).settle_attempt("r1", "c1", Attempt.NONE, expected=Attempt.REFUSED, commit_by=100.0)
    assert state(store, "r1") is Attempt.PENDING
    with pytest.raises(IllegalAttemptChange):
        FrontRecords(store).settle_attempt("r1", "c1", Attempt.MADE, expected=Attempt.NONE)


def test_the_winner_settles_a_refused_attempt_as_made(store):
    """A later copy of a refused Allocate made the session: recording it makes the attempt made."""
    FrontRecords(store).note_attempt("r1", "c1", 100.0)
    FrontRecords(store).settle_attempt("r1", "c1", Attempt.REFUSED)
    assert FrontRecords(store).remember_request("r1", "c1.s-a", "c1", 1.0) == "c1.s-a"
    assert state(store, "r1") is Attempt.MADE and FrontRecords(store).open_attempts("r1") == []


# ---- the claim: a request's first attempt, and what it holds back -----------------------------

def test_the_first_attempt_anywhere_claims_the_request(store):
    assert FrontRecords(store).note_attempt("r1", "c1", 100.0).first
    assert not FrontRecords(store).note_attempt("r1", "c1", 110.0).first  # again there: a retry, another replica
    assert not FrontRecords(store).note_attempt("r1", "c2", 110.0).first
    assert FrontRecords(store).note_attempt("r2", "c2", 100.0).first  # requests are apart


def test_no_other_session_is_recorded_while_the_claims_attempt_may_have_made_one(store):
    FrontRecords(store).note_attempt("r1", "c1", 100.0)  # the claim's placement, which may answer before recording
    FrontRecords(store).note_attempt("r1", "c2", 100.0)  # another placement of the request, moved on to c2
    assert FrontRecords(store).remember_request("r1", "c2.s-b", "c2", 1.0) is None
    assert FrontRecords(store).session_for_request("r1") is None and state(store, "r1", "c2") is Attempt.PENDING
    # Refused at c1 is not enough: a late copy of its Allocate may still make it there.
    assert FrontRecords(store).settle_attempt("r1", "c1", Attempt.REFUSED)
    assert FrontRecords(store).remember_request("r1", "c2.s-b", "c2", 1.0) is None
    # Settled as made nothing, it holds nothing back.
    assert FrontRecords(store).settle_attempt("r1", "c1", Attempt.NONE, expected=Attempt.REFUSED)
    assert FrontRecords(store).remember_request("r1", "c2.s-b", "c2", 1.0) == "c2.s-b"
    assert state(store, "r1", "c2") is Attempt.MADE


def test_the_claims_own_cluster_is_never_held_back(store):
    FrontRecords(store).note_attempt("r1", "c1", 100.0)
    FrontRecords(store).note_attempt("r1", "c2", 100.0)
    assert FrontRecords(store).remember_request("r1", "c1.s-a", "c1", 1.0) == "c1.s-a"
    assert FrontRecords(store).remember_request("r1", "c2.s-b", "c2", 1.0) == "c1.s-a"  # first writer wins, as ever


def test_a_waived_claim_holds_nothing_back(store):
    FrontRecords(store).note_attempt("r1", "c1", 100.0)
    # Its placement moves on without answering: the settle waives, whether or not it applies.
    assert not FrontRecords(store).settle_attempt("r1", "c1", Attempt.NONE, expected=Attempt.UNRESOLVED, waive=True)
    FrontRecords(store).note_attempt("r1", "c2", 100.0)
    assert FrontRecords(store).remember_request("r1", "c2.s-b", "c2", 1.0) == "c2.s-b"


def test_the_database_holds_back_a_writer_that_knows_nothing_of_claims(store):
    """A front of an earlier release records the winner with a plain insert: the claim still holds."""
    FrontRecords(store).note_attempt("r1", "c1", 100.0)
    FrontRecords(store).note_attempt("r1", "c2", 100.0)
    with store.transaction() as cur:
        cur.execute(store.sql("INSERT INTO front_requests (request_id, session_id, cluster, created_at) "
                               "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"), ("r1", "c2.s-b", "c2", 1.0))
    assert FrontRecords(store).session_for_request("r1") is None


def claims(store) -> set[str]:
    with store.reading() as cur:
        cur.execute("SELECT request_id FROM front_claims")
        return {r for (r,) in cur.fetchall()}


def test_claims_are_pruned_with_their_first_attempt_and_not_before(store):
    FrontRecords(store).note_attempt("settled", "c1", 100.0)
    FrontRecords(store).remember_request("settled", "c1.s-a", "c1", 1.0)
    FrontRecords(store).note_attempt("open", "c1", 100.0)  # its outcome unknown: it must keep holding back others
    FrontRecords(store).note_attempt("recent", "c1", 500.0)
    FrontRecords(store).remember_request("recent", "c1.s-c", "c1", 1.0)
    FrontRecords(store).prune_attempts(before=200.0)
    assert claims(store) == {"open", "recent"}
    FrontRecords(store).note_attempt("open", "c2", 100.0)
    assert FrontRecords(store).remember_request("open", "c2.s-b", "c2", 1.0) is None
