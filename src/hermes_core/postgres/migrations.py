"""The PostgreSQL schema, versioned per component like the SQLite one (storage/sqlite.py).

Each component (the same names as in SQLite: gateway, sessions, longterm, journal, pending,
traces; and schedules, whose tables SQLite keeps in its gateway component) has numbered
migrations; `schema_versions` records the highest applied, and a store applies
those above it before its first transaction (postgres/database.py: one transaction per component,
under an advisory lock, so nodes that start together apply each once). A released migration is
never edited: a change is a new number. `hermes-kernel doctor` compares the recorded versions with
these (`expected_versions`).

The numbering is PostgreSQL's own: version 1 of each component is the SQLite schema as it stands
today (the SQLite history — columns added one migration at a time — is not replayed). Times are
seconds since the epoch (DOUBLE PRECISION) and payloads JSON text, as in SQLite, so a row reads the
same from either store. Long-term memory searches with PostgreSQL's full-text search over the same
CJK-bigram text SQLite's FTS5 indexes (memory/longterm.py), in a generated `tsvector` column.
"""

from __future__ import annotations

GATEWAY: dict[int, str] = {
    1: """
    CREATE TABLE inbox (
        id BIGSERIAL PRIMARY KEY,
        channel TEXT NOT NULL,
        conversation TEXT NOT NULL,
        message_id TEXT NOT NULL,
        payload TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'pending',      -- pending | done | set_aside
        received_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        attempts INTEGER NOT NULL DEFAULT 0,
        set_aside_reason TEXT,
        UNIQUE (channel, message_id)
    );
    CREATE INDEX inbox_by_status ON inbox (status, id);
    CREATE INDEX inbox_pending_by_conversation ON inbox (conversation, id) WHERE status = 'pending';
    CREATE TABLE seen_events (
        channel TEXT NOT NULL,
        event_id TEXT NOT NULL,
        seen_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (channel, event_id)
    );
    CREATE INDEX seen_events_by_time ON seen_events (seen_at);
    CREATE TABLE outbox (
        id BIGSERIAL PRIMARY KEY,
        inbound_id BIGINT,
        channel TEXT NOT NULL,
        conversation TEXT NOT NULL,
        payload TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'pending',      -- pending | sent | dead
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        platform_id TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        sent_at DOUBLE PRECISION
    );
    CREATE INDEX outbox_by_status ON outbox (status, id);
    CREATE INDEX outbox_by_inbound ON outbox (inbound_id, id);
    CREATE TABLE dead_letters (
        outbox_id BIGINT PRIMARY KEY,
        channel TEXT NOT NULL,
        conversation TEXT NOT NULL,
        payload TEXT NOT NULL,
        error TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        dead_at DOUBLE PRECISION NOT NULL,
        resend_requested_at DOUBLE PRECISION
    );
    CREATE INDEX dead_letters_by_resend ON dead_letters (resend_requested_at);
    CREATE TABLE seen_nonces (
        channel TEXT NOT NULL,
        nonce TEXT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (channel, nonce)
    );
    CREATE INDEX seen_nonces_by_expiry ON seen_nonces (expires_at);
    -- the node running a turn of the conversation, until its lease expires (renewed while it runs)
    CREATE TABLE turn_claims (
        conversation TEXT PRIMARY KEY,
        node TEXT NOT NULL,
        inbound_id BIGINT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL
    )
    """,
    # 2: the platform message a reply is streamed into (SQLite's gateway migration 7)
    2: """
    CREATE TABLE streams (
        inbound_id BIGINT PRIMARY KEY,
        channel TEXT NOT NULL,
        platform_id TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL
    )
    """,
    # 3: the Feishu send limits counted for every node and worker together (postgres/quota.py): per
    # scope (an app's per-second or per-minute limit, a chat) the moment its bucket is full again
    3: """
    CREATE TABLE send_quota (
        scope TEXT PRIMARY KEY,
        due DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX send_quota_by_due ON send_quota (due)
    """,
    # 4: whether the bot was removed from a chat, as of the platform's time of the change
    # (SQLite's gateway migration 8)
    4: """
    CREATE TABLE chat_membership (
        channel TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        is_left BOOLEAN NOT NULL,
        changed_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (channel, chat_id)
    )
    """,
    # 5: each take of a conversation's claim gets a new epoch, from one sequence (never reused, even
    # after the row is deleted): the fencing token a turn's writes are checked against (tasks/fence.py)
    5: """
    CREATE SEQUENCE turn_claim_epochs;
    ALTER TABLE turn_claims ADD COLUMN epoch BIGINT NOT NULL DEFAULT nextval('turn_claim_epochs')
    """,
    # 6: which node sends a pending reply, until when (database clock; renewed while the node
    # lives): another node takes over a dead node's unsent replies once the hold has expired
    6: """
    ALTER TABLE outbox ADD COLUMN node TEXT;
    ALTER TABLE outbox ADD COLUMN held_until DOUBLE PRECISION NOT NULL DEFAULT 0;
    CREATE INDEX outbox_pending_by_node ON outbox (node) WHERE status = 'pending';
    CREATE INDEX outbox_pending_by_hold ON outbox (held_until, id) WHERE status = 'pending'
    """,
}

SESSIONS: dict[int, str] = {
    1: """
    CREATE TABLE session_messages (
        conversation TEXT NOT NULL,
        seq INTEGER NOT NULL,
        message TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (conversation, seq)
    );
    CREATE TABLE session_state (
        conversation TEXT PRIMARY KEY,
        state TEXT NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE session_turns (
        conversation TEXT NOT NULL,
        turn_id TEXT NOT NULL,
        first_seq INTEGER NOT NULL,
        messages INTEGER NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (conversation, turn_id)
    )
    """,
    # 2: history older than `memory.retention_days` is deleted by age (SessionStore.prune)
    2: "CREATE INDEX session_messages_by_time ON session_messages (created_at)",
}

LONGTERM: dict[int, str] = {
    1: """
    CREATE TABLE longterm_outcomes (
        id BIGSERIAL PRIMARY KEY,
        owner TEXT NOT NULL,
        task_type TEXT NOT NULL,
        params TEXT NOT NULL,
        result TEXT NOT NULL,
        at TEXT NOT NULL,
        -- the searchable text (CJK runs as bigrams), written by the store, weighted as SQLite's bm25
        search TSVECTOR NOT NULL
    );
    CREATE INDEX longterm_outcomes_by_owner ON longterm_outcomes (owner, id);
    CREATE INDEX longterm_outcomes_search ON longterm_outcomes USING GIN (search)
    """,
}

JOURNAL: dict[int, str] = {
    1: """
    CREATE TABLE task_journal (
        task_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        data TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (task_id, seq)
    );
    CREATE INDEX task_journal_by_time ON task_journal (at)
    """,
}

PENDING: dict[int, str] = {
    1: """
    CREATE TABLE pending (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        task_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        arguments TEXT NOT NULL,
        requested_by TEXT NOT NULL,
        channel TEXT NOT NULL,
        conversation TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION,
        status TEXT NOT NULL,
        decided_by TEXT,
        decided_at DOUBLE PRECISION,
        answer TEXT,
        resume TEXT,
        UNIQUE (task_id, call_id)
    );
    CREATE INDEX pending_open ON pending (status, expires_at);
    CREATE INDEX pending_by_conversation ON pending (conversation, status)
    """,
}

TRACES: dict[int, str] = {
    1: """
    CREATE TABLE traces (
        task_id TEXT PRIMARY KEY,
        conversation TEXT,
        input TEXT NOT NULL,
        started_at DOUBLE PRECISION NOT NULL,
        finished_at DOUBLE PRECISION,
        stop_reason TEXT NOT NULL,
        ok BOOLEAN NOT NULL,
        failed BOOLEAN NOT NULL,
        reply TEXT NOT NULL,
        model_calls INTEGER NOT NULL,
        tool_names TEXT NOT NULL,
        tokens BIGINT NOT NULL,
        data TEXT NOT NULL
    );
    CREATE INDEX traces_by_start ON traces (started_at);
    CREATE INDEX traces_by_conversation ON traces (conversation, started_at);
    CREATE TABLE trace_tools (
        tool TEXT NOT NULL,
        task_id TEXT NOT NULL REFERENCES traces (task_id) ON DELETE CASCADE,
        PRIMARY KEY (tool, task_id)
    )
    """,
}

# scheduled jobs (postgres/schedules.py): in SQLite they are gateway migration 6; here a component of
# their own. A fire is claimed by inserting its `schedule_fires` row (job, fire time) in the
# transaction that locks the job's row (FOR UPDATE SKIP LOCKED) and moves its next_fire on; the
# embedded engine inserts its inbox row (`inbox_id`) there too, the Temporal engine keeps its
# message (`payload`) until the fire is signalled to its workflow (`delivered_at`).
SCHEDULES: dict[int, str] = {
    1: """
    CREATE TABLE schedule_jobs (
        id TEXT PRIMARY KEY,
        job TEXT NOT NULL,                           -- JSON of schedule.jobs.Job
        conversation TEXT NOT NULL,
        status TEXT NOT NULL,                        -- active | done | cancelled
        next_fire DOUBLE PRECISION,
        created_at DOUBLE PRECISION NOT NULL
    );
    CREATE INDEX schedule_jobs_due ON schedule_jobs (status, next_fire);
    CREATE INDEX schedule_jobs_by_conversation ON schedule_jobs (conversation, status);
    CREATE TABLE schedule_fires (
        job_id TEXT NOT NULL,
        fire_at DOUBLE PRECISION NOT NULL,
        status TEXT NOT NULL,                        -- queued | skipped | refused
        reason TEXT NOT NULL DEFAULT '',
        inbox_id BIGINT,
        claimed_at DOUBLE PRECISION NOT NULL,
        claimed_by TEXT NOT NULL DEFAULT '',         -- the node that claimed it
        payload TEXT,                                -- engine temporal: the message to signal
        delivered_at DOUBLE PRECISION,               -- engine temporal: signalled to its workflow
        PRIMARY KEY (job_id, fire_at)
    );
    CREATE INDEX schedule_fires_undelivered ON schedule_fires (claimed_at)
        WHERE payload IS NOT NULL AND delivered_at IS NULL
    """,
}

COMPONENTS: dict[str, dict[int, str]] = {
    "gateway": GATEWAY,
    "sessions": SESSIONS,
    "longterm": LONGTERM,
    "journal": JOURNAL,
    "pending": PENDING,
    "traces": TRACES,
    "schedules": SCHEDULES,
}


def expected_versions() -> dict[str, int]:
    """The version each component is at once every migration of this release is applied."""
    return {component: max(migrations) for component, migrations in COMPONENTS.items()}
