-- Idempotency keys (AIP-155) name one request, not one erasure of the company. A key was unique
-- per company alone, and a second request under it got the first one's erasure back: a ticket id
-- reused for a second person, or for a seat, returned a receipt for an erasure of someone else,
-- and the person or seat it named was never erased. A key is now scoped to what the erasure is of
-- (its kind and its seat), so a seat's keys are its own (a token bound to one seat never meets
-- another seat's erasure, or learns that its key is taken); within that scope the request it first
-- named is kept as a digest (kind, seat, the person's identifiers and names, hashed), and a reuse
-- for a different request is refused rather than answered with the earlier erasure.
--
-- The scoped key is a column of its own, so that the previous release keeps working on this
-- schema during a rollout (docs/deploy.md, Compatibility): its statements name request_id and the
-- erasures_request index, both left as they were. This release writes request_key (request_id
-- NULL) and finds a key in either column; a later release copies the request_id of rows the
-- previous one wrote into request_key and drops request_id with its index. Until then, a retry
-- that an old pod serves does not see a key a new pod recorded, and queues a second erasure of
-- the same target (a second audit row; erasing twice finds nothing the second time).
ALTER TABLE erasures ADD COLUMN request_key text;
ALTER TABLE erasures ADD COLUMN request_digest text NOT NULL DEFAULT '';
CREATE UNIQUE INDEX erasures_request_scope ON erasures (company, kind, seat, request_key)
    WHERE request_key IS NOT NULL;
