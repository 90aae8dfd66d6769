-- erasures: one row per erasure (issue 17): the audit (who asked, when, what kind, the counts) and,
-- while it runs, the target. The person's identifiers and names, and the run ids collected from
-- them, are kept only until the erasure finishes; afterwards the row names the person only by a
-- digest (subject_digest), so the audit keeps no copy of what was erased.
CREATE TABLE erasures (
    id              uuid PRIMARY KEY,
    company         text NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('subject', 'seat', 'company')),
    seat            text NOT NULL DEFAULT '',
    subject_digest  text NOT NULL DEFAULT '',
    request_id      text,
    requested_by    text NOT NULL,
    state           text NOT NULL CHECK (state IN ('queued', 'running', 'succeeded', 'failed')),
    target          jsonb,                              -- NULL once finished
    collected       boolean NOT NULL DEFAULT false,     -- the person's run ids and sessions are in target
    reports         jsonb NOT NULL DEFAULT '{}'::jsonb, -- owner -> what it erased (counts and ids)
    residues        jsonb NOT NULL DEFAULT '{}'::jsonb, -- owner -> what the verification still found
    verified        boolean NOT NULL DEFAULT false,
    reason          text NOT NULL DEFAULT '',
    create_time     timestamptz NOT NULL,
    finish_time     timestamptz
);
-- Idempotent requests (AIP-155).
CREATE UNIQUE INDEX erasures_request ON erasures (company, request_id) WHERE request_id IS NOT NULL;
-- ListErasures: the company's audit, newest first.
CREATE INDEX erasures_company_recent ON erasures (company, create_time DESC, id DESC);
