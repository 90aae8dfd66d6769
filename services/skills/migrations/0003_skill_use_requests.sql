-- Idempotency keys of MarkSkillsUsed (AIP-155): a reflection redone after a crash counts a turn's
-- uses once.
CREATE TABLE skill_use_requests (
    company    text NOT NULL,
    seat       text NOT NULL,
    request_id text NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (company, seat, request_id)
);
