-- Idempotency keys of written notes (AIP-155), kept apart from the notes so a key outlives its
-- note: a retried or redelivered WriteNote whose note was deleted or erased since writes nothing
-- again (an operator's delete or an erasure is never undone by a late retry). A SHORT note's key
-- is spent until the note's own expiry (expire_time): past it the key is free again, as the note
-- would be gone anyway, and a write with it stores a new note (a fact learned again). Ids and
-- times only, never a note's text. Kept as long as a note of the company is (the retention prune,
-- learning.privacy note_max_age_days; forever without one, as profile_requests); an erasure takes
-- the keys of the notes it deletes, of the seat, or of the company.
CREATE TABLE diary_requests (
    company     text NOT NULL,
    seat        text NOT NULL,
    request_id  text NOT NULL,
    note_id     uuid NOT NULL,  -- the note the key's write stored (it may be gone since)
    create_time timestamptz NOT NULL,
    expire_time timestamptz,    -- that note's expiry (SHORT); NULL: LONG, spent for good
    PRIMARY KEY (company, seat, request_id)
);
-- An erasure: the keys of the notes it deletes.
CREATE INDEX diary_requests_note ON diary_requests (note_id);
-- The retention prune: a company's keys past the cutoff.
CREATE INDEX diary_requests_age ON diary_requests (company, create_time);

-- The keys the notes hold so far.
INSERT INTO diary_requests (company, seat, request_id, note_id, create_time, expire_time)
SELECT company, seat, request_id, id, create_time, expire_time FROM agent_diary WHERE request_id IS NOT NULL
ON CONFLICT DO NOTHING;
-- The key is unique in diary_requests now; on the notes it only says what a note was written with
-- (an expired note not yet swept may share it with the note its key's next write stored).
DROP INDEX agent_diary_request_id;
