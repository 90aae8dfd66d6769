-- What a key's write asked for: a SHA-256 of its canonical fields (company, seat, content, tier,
-- ttl_days, source, turn_id; services.diary.domain.request_digest), never the text itself (this
-- table holds ids and times only). A write reusing the key with a different request is refused
-- (REQUEST_ID_REUSED) instead of answered with the first note while its own content is dropped.
-- NULL: a key claimed before this column existed; its write's request is unknown, so any request
-- with the key is taken for a retry of it, as before.
ALTER TABLE diary_requests ADD COLUMN request_digest bytea;
