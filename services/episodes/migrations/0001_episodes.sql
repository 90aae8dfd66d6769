-- episodes: one raw row per settled turn of a seat (with its own vector, so the index can be
-- rebuilt from here without one embedding call), and the compacted rows the lifecycle pass folds
-- clusters of old raw rows into (never embedded).
CREATE EXTENSION IF NOT EXISTS btree_gin;

CREATE TABLE episodes (
    id                          uuid PRIMARY KEY,
    company                     text NOT NULL,
    seat                        text NOT NULL,
    role                        text,
    kind                        text NOT NULL CHECK (kind IN ('raw', 'compacted')),
    turn_id                     text,                 -- the run id (raw); NULL on compacted rows
    work_item                   text,                 -- 'native:<id>' | 'jira:<id>' | NULL
    label                       text NOT NULL DEFAULT '',   -- task_summary: what woke the turn
    ask                         text NOT NULL DEFAULT '',   -- stored whole; '' when told nothing
    what_it_did                 text NOT NULL DEFAULT '',   -- plan_summary
    outcome                     text NOT NULL CHECK (outcome IN ('done', 'failed', 'self_iterate', 'skipped')),
    review_outcome              text NOT NULL DEFAULT '',
    tool_sequence               text[] NOT NULL DEFAULT '{}',
    tools_called                text[] NOT NULL DEFAULT '{}',
    skills_used                 text[] NOT NULL DEFAULT '{}',
    subjects                    text[] NOT NULL DEFAULT '{}',
    conversation_id             text,
    start_time                  timestamptz NOT NULL,
    end_time                    timestamptz NOT NULL,
    duration_ms                 bigint NOT NULL DEFAULT 0,
    record_time                 timestamptz NOT NULL,
    -- Compacted rows (spec "Episode lifecycle": the field table by kind).
    count                       int NOT NULL DEFAULT 1,
    common_task_pattern         text NOT NULL DEFAULT '',
    common_outcome              text NOT NULL DEFAULT '',
    success_rate                real NOT NULL DEFAULT 0,
    done_count                  int NOT NULL DEFAULT 0,
    subjects_involved           text[] NOT NULL DEFAULT '{}',
    notable_patterns            text[] NOT NULL DEFAULT '{}',
    exemplar_turn_ids           text[] NOT NULL DEFAULT '{}',
    -- A raw row a fold kept as a drill-down exemplar: the compacted row it anchors. Never folded
    -- again; evicted with its summary.
    exemplar_of                 uuid,
    consolidated_into_skill_id  text,
    consolidated_time           timestamptz,          -- when a skill was drafted from this row
    -- The row's vector (raw rows only).
    embedding                   vector,
    embedding_model             text,
    embedding_dims              int,
    indexed                     boolean NOT NULL DEFAULT false,  -- the vector is in the index
    fill_held_until             timestamptz,
    fill_held_fingerprint       text,
    fill_alone                  boolean NOT NULL DEFAULT false,  -- once refused, offered alone
    -- The lexical half: the same three parts the vector is of.
    tsv                         tsvector GENERATED ALWAYS AS (
                                    to_tsvector('english', label || ' ' || ask || ' ' || what_it_did)) STORED,
    CHECK (end_time >= start_time),
    CHECK ((kind = 'raw') = (turn_id IS NOT NULL)),
    CHECK (kind = 'raw' OR (count >= 1 AND embedding IS NULL AND work_item IS NULL
                            AND consolidated_into_skill_id IS NULL AND exemplar_of IS NULL)),
    CHECK (kind = 'compacted' OR count = 1)
);

-- Idempotent recording: one raw row per run id of a seat (compacted rows have no run id). Also
-- GetEpisode by run id and MarkEpisodesConsolidated.
CREATE UNIQUE INDEX episodes_turn ON episodes (company, seat, turn_id);
-- ListEpisodes (both kinds, newest first) and the seat's newest role.
CREATE INDEX episodes_seat_recent ON episodes (company, seat, end_time DESC, id DESC);
-- The lifecycle's one count per seat (an index-only count), its age-ordered candidate reads, the
-- raw-only listing, ListEpisodeSeats' skip scan, and the exact vector scan's seat predicate.
CREATE INDEX episodes_seat_raw ON episodes (company, seat, end_time, id) WHERE kind = 'raw';
-- The conversation path.
CREATE INDEX episodes_seat_conversation ON episodes (company, seat, conversation_id, end_time DESC, id DESC)
    WHERE conversation_id IS NOT NULL;
-- The lexical half: raw rows only, the seat's keys inside the GIN index.
CREATE INDEX episodes_seat_tsv ON episodes USING gin (company, seat, tsv) WHERE kind = 'raw';
-- The compacted eviction and its exemplars.
CREATE INDEX episodes_seat_compacted ON episodes (company, seat, end_time) WHERE kind = 'compacted';
CREATE INDEX episodes_exemplar_of ON episodes (exemplar_of) WHERE exemplar_of IS NOT NULL;
-- Fill: raw rows with no vector of the current model and width (none yet, or the company left
-- theirs), read as ranges of this index so a minute with nothing to fill reads no rows; and rows
-- whose vector is not in the index yet.
CREATE INDEX episodes_fill ON episodes (embedding_model, embedding_dims, company, seat) WHERE kind = 'raw';
CREATE INDEX episodes_unindexed ON episodes (company, seat) WHERE embedding IS NOT NULL AND NOT indexed;
