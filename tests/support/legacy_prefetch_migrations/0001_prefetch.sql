-- The prefetch's own state: onboarding markers and the per-run refresh ledger. Both are in
-- Postgres so that any replica answers for any seat and any run.

-- mark_onboarded bookkeeping: one marker per seat, stamped with the hash of the unit chain the seat
-- onboarded to. A chain change (a new hash) re-fires the First-turn onboarding block.
CREATE TABLE agent_onboarding_markers (
    company      text NOT NULL,
    seat         text NOT NULL,
    chain_hash   text NOT NULL,
    unit_chain   text[] NOT NULL,
    marked_time  timestamptz NOT NULL,
    PRIMARY KEY (company, seat)
);

-- refresh_memory's ledger: one row per run id (a turn's execution) with the refreshes it spent;
-- bounded per company to the newest learning.personal_memory.refresh_ledger_runs runs (by seq).
CREATE TABLE refresh_ledger_runs (
    company      text NOT NULL,
    seat         text NOT NULL,
    turn_id      text NOT NULL,
    spent        int NOT NULL DEFAULT 0,
    create_time  timestamptz NOT NULL,
    seq          bigserial NOT NULL,
    PRIMARY KEY (company, seat, turn_id)
);
CREATE INDEX refresh_ledger_runs_newest ON refresh_ledger_runs (company, seq DESC);

-- One row per normalised hint of a run: the notes the filter selected (the rows, so a repeat with a
-- larger limit renders more), how many of them were shown (and so marked used) so far, or that the
-- filter failed (a retry of that hint runs the filter again).
CREATE TABLE refresh_ledger_hints (
    company      text NOT NULL,
    seat         text NOT NULL,
    turn_id      text NOT NULL,
    hint_key     text NOT NULL,
    hint         text NOT NULL,
    status       text NOT NULL CHECK (status IN ('answered', 'failed')),
    notes        jsonb NOT NULL DEFAULT '[]'::jsonb,
    shown        int NOT NULL DEFAULT 0,
    update_time  timestamptz NOT NULL,
    PRIMARY KEY (company, seat, turn_id, hint_key),
    FOREIGN KEY (company, seat, turn_id) REFERENCES refresh_ledger_runs (company, seat, turn_id) ON DELETE CASCADE
);
