-- The one durable queue of background work (libs/common/jobs.py): a `kind` per job family
-- (`reflection`: a finished turn to reflect; `learning`: a session learning check). One row per
-- (kind, company, key) is the durable duplicate gate; the key is the family's own name of the
-- work (the reflector's names the seat and the run id).
CREATE TABLE background_jobs (
    id            bigserial PRIMARY KEY,
    kind          text NOT NULL,
    key           text NOT NULL,
    company       text NOT NULL,
    seat          text NOT NULL,
    payload       bytea NOT NULL,
    trace_carrier jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- queued: waiting for run_after; running: claimed, locked_by holds it until locked_until;
    -- done; dead: dead-lettered (reason kept); interrupted: its holder stopped and the family
    -- reports that rather than replaying it (reason kept).
    state         text NOT NULL DEFAULT 'queued'
                  CHECK (state IN ('queued', 'running', 'done', 'dead', 'interrupted')),
    attempts      int NOT NULL DEFAULT 0,     -- claims that counted (a deferral gives its claim back)
    run_after     timestamptz NOT NULL,
    locked_by     text,
    locked_until  timestamptz,
    reason        text,                       -- why it was last retried, dead-lettered or interrupted
    create_time   timestamptz NOT NULL,
    finish_time   timestamptz,
    UNIQUE (kind, company, key)
);
CREATE INDEX background_jobs_ready ON background_jobs (kind, run_after, id) WHERE state IN ('queued', 'running');
