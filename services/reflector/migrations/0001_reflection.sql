-- A general durable job queue (a `kind` per job family: reflections now, session learning checks
-- later) and the record of each turn's reflection.
CREATE TABLE reflection_jobs (
    id            bigserial PRIMARY KEY,
    kind          text NOT NULL,
    key           text NOT NULL,              -- the run id for a reflection
    company       text NOT NULL,
    seat          text NOT NULL,
    payload       bytea NOT NULL,             -- the serialized TurnCompleted
    trace_carrier jsonb NOT NULL DEFAULT '{}'::jsonb,
    state         text NOT NULL DEFAULT 'queued' CHECK (state IN ('queued', 'running', 'done')),
    attempts      int NOT NULL DEFAULT 0,
    run_after     timestamptz NOT NULL,
    locked_by     text,
    locked_until  timestamptz,
    create_time   timestamptz NOT NULL,
    finish_time   timestamptz,
    UNIQUE (kind, company, key)               -- a run id is queued once: durable dedup
);
CREATE INDEX reflection_jobs_ready ON reflection_jobs (kind, run_after, id) WHERE state <> 'done';

CREATE TABLE reflections (
    company       text NOT NULL,
    seat          text NOT NULL,
    turn_id       text NOT NULL,
    state         text NOT NULL,              -- queued | running | completed | gated | deferred
    gate          text,
    workers       jsonb NOT NULL DEFAULT '[]'::jsonb,
    attempts      int NOT NULL DEFAULT 0,
    submit_time   timestamptz NOT NULL,
    complete_time timestamptz,
    PRIMARY KEY (company, turn_id)
);
CREATE INDEX reflections_seat_recent ON reflections (company, seat, submit_time DESC, turn_id DESC);
