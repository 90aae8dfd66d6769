-- The vector fill's request count and the provider's "not now", per minute, for every process on
-- this database (libs/common/fill.py: PostgresRequestLedger): "sixteen requests a node ... a rate
-- limit ... ends the minute for every seat". On Kubernetes the diary, episode and knowledge fills
-- are three pods; a count in each process's memory let them send three times the sixteen, and a
-- rate limit met by one did not stop the others. One row per minute; rows an hour old are pruned.
CREATE TABLE fill_requests (
    window_start timestamptz PRIMARY KEY,
    sent         integer NOT NULL DEFAULT 0,
    ended        text
);
