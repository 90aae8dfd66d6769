-- chat_sessions: one row per session, its owner (fixed by the first append), workspace, seat and
-- role, the last event sequence and the latest plan revision. Every write to a session locks this
-- row, so sequence numbers, plan revisions and "one queued or running check" hold under races.
CREATE TABLE chat_sessions (
    company        text NOT NULL,
    session_id     text NOT NULL,
    owner          text NOT NULL,
    workspace      text NOT NULL,
    seat           text NOT NULL,
    role           text NOT NULL DEFAULT '',
    last_seq       bigint NOT NULL DEFAULT 0,
    plan_revision  bigint NOT NULL DEFAULT 0,
    create_time    timestamptz NOT NULL,
    update_time    timestamptz NOT NULL,
    PRIMARY KEY (company, session_id)
);

-- session_events: what the engine recorded, verbatim (redaction happens when a check reads it).
-- seq orders a session's events as recorded; event_id makes appends idempotent.
CREATE TABLE session_events (
    company       text NOT NULL,
    session_id    text NOT NULL,
    seq           bigint NOT NULL,
    event_id      text NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('user_message', 'assistant_message', 'tool_request',
                                                'tool_result', 'verification', 'turn_end')),
    text          text NOT NULL,
    event_time    timestamptz NOT NULL,
    turn_id       text NOT NULL DEFAULT '',
    tool_name     text NOT NULL DEFAULT '',
    source        text NOT NULL DEFAULT '',
    status        text NOT NULL DEFAULT 'unspecified',
    turn_outcome  text NOT NULL DEFAULT 'unspecified',
    remember      boolean NOT NULL DEFAULT false,
    record_time   timestamptz NOT NULL,
    PRIMARY KEY (company, session_id, seq),
    UNIQUE (company, session_id, event_id),
    FOREIGN KEY (company, session_id) REFERENCES chat_sessions (company, session_id) ON DELETE CASCADE
);
-- The evidence reads: the newest events of some kinds at or before a sequence.
CREATE INDEX session_events_kind ON session_events (company, session_id, kind, seq DESC);
-- The substantial-turn trigger: a turn's events.
CREATE INDEX session_events_turn ON session_events (company, session_id, turn_id, seq);

-- session_plans: every saved revision of a session's execution plan.
CREATE TABLE session_plans (
    company     text NOT NULL,
    session_id  text NOT NULL,
    revision    bigint NOT NULL,
    steps       jsonb NOT NULL,
    save_time   timestamptz NOT NULL,
    PRIMARY KEY (company, session_id, revision),
    FOREIGN KEY (company, session_id) REFERENCES chat_sessions (company, session_id) ON DELETE CASCADE
);

-- learning_checks: the receipt of every check (its job is in background_jobs, kind 'learning',
-- under job_key). Never raw evidence: outputs, reasons, failures and counts only.
CREATE TABLE learning_checks (
    id                uuid PRIMARY KEY,
    company           text NOT NULL,
    session_id        text NOT NULL,
    owner             text NOT NULL,
    workspace         text NOT NULL,
    seat              text NOT NULL,
    role              text NOT NULL DEFAULT '',
    trigger           text NOT NULL CHECK (trigger IN ('plan_steps_done', 'plan_completed', 'substantial_turn', 'manual')),
    plan_revision     bigint NOT NULL DEFAULT 0,
    newly_done        text[] NOT NULL DEFAULT '{}',
    turn_id           text NOT NULL DEFAULT '',
    trigger_seq       bigint NOT NULL,
    trigger_event_id  text NOT NULL DEFAULT '',
    job_key           text NOT NULL,
    state             text NOT NULL CHECK (state IN ('queued', 'running', 'completed', 'failed', 'interrupted')),
    outcome           text,
    reason            text NOT NULL DEFAULT '',
    outputs           jsonb NOT NULL DEFAULT '[]'::jsonb,
    dropped           jsonb NOT NULL DEFAULT '[]'::jsonb,
    partial_failures  jsonb NOT NULL DEFAULT '[]'::jsonb,
    evidence          jsonb NOT NULL DEFAULT '{}'::jsonb,
    create_time       timestamptz NOT NULL,
    start_time        timestamptz,
    finish_time       timestamptz,
    UNIQUE (company, job_key),
    FOREIGN KEY (company, session_id) REFERENCES chat_sessions (company, session_id) ON DELETE CASCADE
);
-- The receipts of a session, newest first (ListLearningChecks).
CREATE INDEX learning_checks_session ON learning_checks (company, session_id, create_time DESC, id DESC);
-- The queued or running check of a session (CheckRecentWork reuses it).
CREATE INDEX learning_checks_active ON learning_checks (company, session_id) WHERE state IN ('queued', 'running');
-- The away digest: a user's finished checks by finish time.
CREATE INDEX learning_checks_away ON learning_checks (company, owner, finish_time DESC, id DESC)
    WHERE finish_time IS NOT NULL;

-- workspace_lessons: the project lessons written as knowledge pages, by their normalized content,
-- with every source that taught them (identical normalized content reuses its page).
CREATE TABLE workspace_lessons (
    company       text NOT NULL,
    workspace     text NOT NULL,
    content_hash  text NOT NULL,
    page_id       text NOT NULL,
    title         text NOT NULL,
    body          text NOT NULL,
    sources       jsonb NOT NULL DEFAULT '[]'::jsonb,
    create_time   timestamptz NOT NULL,
    update_time   timestamptz NOT NULL,
    PRIMARY KEY (company, workspace, content_hash)
);
