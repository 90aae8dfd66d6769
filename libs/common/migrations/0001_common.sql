-- Shared infrastructure: pgvector, the event log, pass leases, auxiliary-token budgets.
CREATE EXTENSION IF NOT EXISTS vector;

-- Events (turn_completed, auxiliary_spend, memory_fill_*, skill_*, ...): the dashboard's log.
CREATE TABLE events (
    id          bigserial PRIMARY KEY,
    time        timestamptz NOT NULL,
    kind        text NOT NULL,
    company     text,
    seat        text,
    turn_id     text,
    trace_id    text,
    payload     jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX events_kind_time ON events (kind, time DESC);
CREATE INDEX events_seat_time ON events (company, seat, time DESC);

-- Lease rows for fleet singletons outside Kubernetes. fence grows on every change of holder, so
-- a write guarded by a lease can tell a newer holder from itself.
CREATE TABLE leases (
    name        text PRIMARY KEY,
    holder      text NOT NULL,
    expire_time timestamptz NOT NULL,
    fence       bigint NOT NULL DEFAULT 1
);

-- Auxiliary tokens spent per scope and window (the budget gate reads these).
CREATE TABLE token_spend (
    company      text NOT NULL,
    seat         text NOT NULL,   -- '' is the company's own row
    window_start timestamptz NOT NULL,
    tokens       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (company, seat, window_start)
);

-- The vector fill (shared by every row family): where a spent minute stopped, per source and
-- company, and the pause after a refused configuration (scope '*'), valid only for the provider
-- fingerprint it was set under.
CREATE TABLE fill_state (
    source             text NOT NULL,
    company            text NOT NULL,
    cursor_seat        text,
    paused_until       timestamptz,
    paused_fingerprint text,
    PRIMARY KEY (source, company)
);

-- Pieces of a long row already embedded, kept across minutes so a retry resumes at the piece
-- that failed. Valid only for the fingerprint and text they were computed from.
CREATE TABLE fill_pieces (
    source      text NOT NULL,
    row_id      uuid NOT NULL,
    fingerprint text NOT NULL,
    text_sha256 text NOT NULL,
    piece       int NOT NULL,
    vector      vector NOT NULL,
    PRIMARY KEY (source, row_id, piece)
);

-- Bytes of text the fill sent per company per minute, across every runner and row family: the
-- provider limits the account, not a process.
CREATE TABLE fill_budget (
    company      text NOT NULL,
    window_start timestamptz NOT NULL,
    bytes        bigint NOT NULL,
    PRIMARY KEY (company, window_start)
);
