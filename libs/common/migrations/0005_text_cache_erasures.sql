-- How many erasures have emptied the caches of people's text (libs/common/text_caches.py): every
-- serving process reads it now and then and empties its own caches when it moved, the backstop of
-- the LISTEN notice, which PgBouncer in transaction mode does not carry. One row.
CREATE TABLE text_cache_erasures (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    generation bigint NOT NULL DEFAULT 0
);
INSERT INTO text_cache_erasures DEFAULT VALUES;
