-- agent_diary: a seat's private notes, each with its own vector (pgvector) so the index can be
-- rebuilt from here without one embedding call.
CREATE EXTENSION IF NOT EXISTS btree_gin;

CREATE TABLE agent_diary (
    id                    uuid PRIMARY KEY,
    company               text NOT NULL,
    seat                  text NOT NULL,
    content               text NOT NULL,
    tier                  text NOT NULL CHECK (tier IN ('long', 'short')),
    source                text NOT NULL,
    turn_id               text,
    create_time           timestamptz NOT NULL,
    expire_time           timestamptz,              -- NULL: a LONG note never expires
    use_count             bigint NOT NULL DEFAULT 0,
    last_used_time        timestamptz,
    embedding             vector,                   -- NULL until the inline embed or the fill
    embedding_model       text,
    embedding_dims        int,
    indexed               boolean NOT NULL DEFAULT false,  -- the vector is in the index
    fill_held_until       timestamptz,
    fill_held_fingerprint text,
    fill_alone            boolean NOT NULL DEFAULT false,  -- once refused, offered alone
    tsv                   tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    CHECK ((tier = 'long') = (expire_time IS NULL))
);

-- Recency half, listing, and every per-seat scan (exact vector scan, counts).
CREATE INDEX agent_diary_seat_recent ON agent_diary (company, seat, create_time DESC, id DESC);
-- Lexical half: the seat's keys inside the GIN index, so a match never walks other seats' rows.
CREATE INDEX agent_diary_seat_tsv ON agent_diary USING gin (company, seat, tsv);
-- Retention sweep of SHORT notes.
CREATE INDEX agent_diary_expiry ON agent_diary (expire_time) WHERE expire_time IS NOT NULL;
-- Fill: notes with no vector yet, and notes whose vector is not in the index yet.
CREATE INDEX agent_diary_unfilled ON agent_diary (company, seat) WHERE embedding IS NULL;
CREATE INDEX agent_diary_unindexed ON agent_diary (company, seat) WHERE embedding IS NOT NULL AND NOT indexed;
