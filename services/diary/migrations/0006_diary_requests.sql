-- Idempotency keys of written notes (AIP-155), kept apart from the notes so a key outlives its
-- note: a retried or redelivered WriteNote whose note was deleted, expired or erased since writes
-- nothing again (an operator's delete or an erasure is never undone by a late retry). Ids and
-- times only, never a note's text. Kept as long as a note of the company is (the retention prune,
-- learning.privacy note_max_age_days; forever without one, as profile_requests); an erasure takes
-- the keys of the notes it deletes, of the seat, or of the company.
CREATE TABLE diary_requests (
    company     text NOT NULL,
    seat        text NOT NULL,
    request_id  text NOT NULL,
    note_id     uuid NOT NULL,  -- the note the first write stored (it may be gone since)
    create_time timestamptz NOT NULL,
    PRIMARY KEY (company, seat, request_id)
);
-- An erasure: the keys of the notes it deletes.
CREATE INDEX diary_requests_note ON diary_requests (note_id);
-- The retention prune: a company's keys past the cutoff.
CREATE INDEX diary_requests_age ON diary_requests (company, create_time);

-- The keys the notes hold so far (agent_diary.request_id stays: its unique index still guards a
-- live note's key).
INSERT INTO diary_requests (company, seat, request_id, note_id, create_time)
SELECT company, seat, request_id, id, create_time FROM agent_diary WHERE request_id IS NOT NULL
ON CONFLICT DO NOTHING;
