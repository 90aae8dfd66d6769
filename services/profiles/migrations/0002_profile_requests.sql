-- Idempotency keys of applied observations (AIP-155): a reflection redone after a crash never
-- merges the same observation twice.
CREATE TABLE profile_requests (
    company     text NOT NULL,
    observer    text NOT NULL,
    request_id  text NOT NULL,
    create_time timestamptz NOT NULL,
    PRIMARY KEY (company, observer, request_id)
);
