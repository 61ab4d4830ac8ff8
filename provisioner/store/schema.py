"""The schema: its migrations, in order, and the lock that serializes applying them."""

from typing import Callable

from provisioner.model.records import split_request_key

_CLAIMS = """CREATE TABLE front_claims (
    request_id TEXT PRIMARY KEY,
    cluster TEXT NOT NULL,
    commit_by DOUBLE PRECISION NOT NULL,
    waived INTEGER NOT NULL DEFAULT 0
)"""
# A new request record that the request's claim holds back.
_CLAIMED = ("SELECT 1 FROM front_claims c JOIN front_attempts a ON a.request_id = c.request_id "
            "AND a.cluster = c.cluster WHERE c.request_id = NEW.request_id AND c.cluster <> NEW.cluster "
            "AND c.waived = 0 AND a.outcome <> 'none'")

# Append only: each entry upgrades the schema by one version. An entry is SQL both databases run
# alike (statements split at ';'), or, where they differ, {dialect: [statement, ...]}.
MIGRATIONS: list[str | dict[str, list[str]]] = [
    """
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        cluster TEXT NOT NULL,
        request_id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        state TEXT NOT NULL,
        revision INTEGER NOT NULL,
        body TEXT NOT NULL,
        UNIQUE (cluster, request_id)
    );
    CREATE INDEX sessions_user ON sessions (cluster, user_id);
    CREATE TABLE vms (
        id TEXT PRIMARY KEY,
        cluster TEXT NOT NULL,
        pool TEXT NOT NULL,
        state TEXT NOT NULL,
        revision INTEGER NOT NULL,
        body TEXT NOT NULL
    );
    CREATE INDEX vms_cluster ON vms (cluster, state);
    CREATE TABLE front_requests (
        request_id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        cluster TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL
    );
    """,
    # Every attempt the front made at placing a request, so an outcome it never heard (a lost
    # reply, a crash) is looked up later instead of guessed.
    """
    CREATE TABLE front_attempts (
        request_id TEXT NOT NULL,
        cluster TEXT NOT NULL,
        commit_by DOUBLE PRECISION NOT NULL,
        outcome TEXT NOT NULL,
        PRIMARY KEY (request_id, cluster)
    );
    CREATE INDEX front_attempts_outcome ON front_attempts (outcome);
    """,
    # What operators set on a cluster, which outlives its processes: the drain flag (pool '') and
    # each pool's policy overrides, as JSON. And the audit log: who did what, when, with what
    # outcome (`source` tells apart the logs of processes sharing one database).
    """
    CREATE TABLE operator_state (
        cluster TEXT NOT NULL,
        pool TEXT NOT NULL,
        body TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (cluster, pool)
    );
    CREATE TABLE audit_log (
        id TEXT PRIMARY KEY,
        source TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        identity TEXT NOT NULL,
        roles TEXT NOT NULL,
        rpc TEXT NOT NULL,
        method TEXT NOT NULL,
        target TEXT NOT NULL,
        outcome TEXT NOT NULL,
        detail TEXT NOT NULL
    );
    CREATE INDEX audit_log_at ON audit_log (source, at, id);
    """,
    # Quotas across front replicas: a per-user lease that serializes check-and-place (wall-time
    # expiry, so a dead holder's lease lapses), and the per-user limits operators set, as JSON.
    """
    CREATE TABLE user_leases (
        user_id TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE quota_overrides (
        user_id TEXT PRIMARY KEY,
        body TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    );
    """,
    # A VM's cached layers and its state changes, apart from its body: an assignment changes the
    # last-use time of a few layers and adds a state change, not the ~40 images a disk holds.
    # Bodies written before keep theirs inline until the VM is next written.
    """
    CREATE TABLE vm_layers (
        vm_id TEXT NOT NULL,
        layer_id TEXT NOT NULL,
        size_bytes BIGINT NOT NULL,
        used_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (vm_id, layer_id)
    );
    CREATE TABLE vm_history (
        vm_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        state TEXT NOT NULL,
        reason TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (vm_id, seq)
    );
    """,
    # Users blocked from new GPU sessions (by an operator or the abuse detector), read on every
    # create; and every decision the detector made, with its evidence, one per flagged session
    # (`blocked` 0: a dry run's, recorded only).
    """
    CREATE TABLE user_blocks (
        user_id TEXT PRIMARY KEY,
        blocked_at DOUBLE PRECISION NOT NULL,
        blocked_by TEXT NOT NULL,
        reason TEXT NOT NULL,
        evidence TEXT NOT NULL
    );
    CREATE INDEX user_blocks_at ON user_blocks (blocked_at, user_id);
    CREATE TABLE abuse_decisions (
        session_id TEXT PRIMARY KEY,
        user_id TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        rules TEXT NOT NULL,
        reason TEXT NOT NULL,
        evidence TEXT NOT NULL,
        blocked INTEGER NOT NULL
    );
    CREATE INDEX abuse_decisions_user ON abuse_decisions (user_id, at);
    """,
    # Blocks lifted, with who lifted them and when: an unblock does not erase why a user was blocked.
    """
    CREATE TABLE user_block_history (
        user_id TEXT NOT NULL,
        blocked_at DOUBLE PRECISION NOT NULL,
        blocked_by TEXT NOT NULL,
        reason TEXT NOT NULL,
        evidence TEXT NOT NULL,
        lifted_at DOUBLE PRECISION NOT NULL,
        lifted_by TEXT NOT NULL
    );
    CREATE INDEX user_block_history_user ON user_block_history (user_id, lifted_at);
    """,
    # A cluster restarts with its live sessions and the recently ended ones, however long its
    # history; an older one is read by its id, its request or its user.
    """
    ALTER TABLE sessions ADD COLUMN ended_at DOUBLE PRECISION NOT NULL DEFAULT 0;
    CREATE INDEX sessions_state ON sessions (cluster, state);
    CREATE INDEX sessions_ended ON sessions (cluster, ended_at);
    """,
    # Quotas across front replicas without a lease: a create's attempt is recorded only if no other
    # create of the user was recorded since its check read the user's admission version, and a
    # check counts the user's placements still under way. Requests carry their user and, once a
    # check has seen their session end, its end: a check that can prove from these alone that a
    # create is within quota asks no cluster. Filled in for earlier rows by `backfill_users`.
    # (user_leases stays: front replicas of the previous release take their leases there until a
    # rolling upgrade has replaced them.)
    """
    CREATE TABLE user_admissions (
        user_id TEXT PRIMARY KEY,
        version BIGINT NOT NULL
    );
    ALTER TABLE front_attempts ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
    CREATE INDEX front_attempts_user ON front_attempts (user_id, outcome);
    ALTER TABLE front_requests ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
    ALTER TABLE front_requests ADD COLUMN ended_at DOUBLE PRECISION;
    CREATE INDEX front_requests_user ON front_requests (user_id, ended_at);
    """,
    # A request's first placement claims it (front/records.py: note_attempt): that placement may answer
    # with what its first cluster made before the request's record is written. So no other session
    # may be recorded as the request's answer while that first attempt may still have made one,
    # unless its placement waived the claim (it moved on without answering). The database keeps
    # the rule, so that every writer obeys it: a front of an earlier release, which knows nothing
    # of claims, finds its record not written. ('none': the attempt made nothing; see
    # front/attempts.py.)
    {
        "sqlite": [
            _CLAIMS,
            "CREATE INDEX front_claims_commit_by ON front_claims (commit_by)",
            f"""CREATE TRIGGER front_requests_claimed BEFORE INSERT ON front_requests
                WHEN EXISTS ({_CLAIMED}) BEGIN SELECT RAISE(IGNORE); END""",
        ],
        "postgres": [
            _CLAIMS,
            "CREATE INDEX front_claims_commit_by ON front_claims (commit_by)",
            f"""CREATE FUNCTION front_requests_claimed() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF EXISTS ({_CLAIMED}) THEN
                        RETURN NULL;
                    END IF;
                    RETURN NEW;
                END $$""",
            "CREATE TRIGGER front_requests_claimed BEFORE INSERT ON front_requests "
            "FOR EACH ROW EXECUTE FUNCTION front_requests_claimed()",
        ],
    },
    # The resolver prunes settled attempts older than an hour every 2 s: by state alone it walked
    # every attempt of the last hour each time (36 ms at 500,000, in the front's writer thread;
    # python -m provisioner.perf.history).
    """
    CREATE INDEX front_attempts_settled ON front_attempts (outcome, commit_by);
    DROP INDEX front_attempts_outcome;
    """,
    # A user's sessions that ended long ago are read from the store by when they ended (a quota
    # check's list of the week): a range of the user's history, not all of it.
    """
    CREATE INDEX sessions_user_ended ON sessions (cluster, user_id, ended_at);
    DROP INDEX sessions_user;
    """,
    # An abuse flag names a session: the front checks that it made that session for that user
    # (front/cluster_reports.py), so a cluster cannot block someone else's user.
    """
    CREATE INDEX front_requests_session ON front_requests (session_id);
    """,
    # Who was on the other end of an audited call (the peer's address), for the record.
    """
    ALTER TABLE audit_log ADD COLUMN peer TEXT NOT NULL DEFAULT '';
    """,
    # A user's list is paged by creation time and id (api/keyset.py), newest first: a page of the
    # sessions that left memory is a range of this index, not the user's whole history. The time
    # in whole nanoseconds, as the API gives it, so a page token compares exactly.
    {
        "sqlite": [
            "ALTER TABLE sessions ADD COLUMN created_ns BIGINT NOT NULL DEFAULT 0",
            "UPDATE sessions SET created_ns = CAST(json_extract(body, '$.created_at') * 1e9 AS INTEGER)",
            "CREATE INDEX sessions_user_created ON sessions (cluster, user_id, created_ns, id)",
        ],
        "postgres": [
            "ALTER TABLE sessions ADD COLUMN created_ns BIGINT NOT NULL DEFAULT 0",
            "UPDATE sessions SET created_ns = "
            "trunc((body::json->>'created_at')::double precision * 1e9::double precision)::bigint",
            "CREATE INDEX sessions_user_created ON sessions (cluster, user_id, created_ns, id)",
        ],
    },
]



def _backfill_users(cur, sql: Callable[[str], str]) -> None:
    """The user of each request and attempt recorded before they carried one (the key's first part)."""
    for table in ("front_requests", "front_attempts"):
        cur.execute(f"SELECT DISTINCT request_id FROM {table} WHERE user_id = ''")
        keys = [key for (key,) in cur.fetchall()]
        cur.executemany(sql(f"UPDATE {table} SET user_id = ? WHERE request_id = ?"),
                        [(split_request_key(key)[0], key) for key in keys])


# Python run after a migration's SQL (given its cursor and the placeholder rewrite), by the
# version it brings the schema to.
BACKFILLS = {9: _backfill_users}

# Serializes schema upgrades between replicas starting at once (PostgreSQL advisory lock key).
MIGRATION_LOCK = 0x70726F76
