-- The work key: names the unit of work a raw row records (a redelivered trigger runs again, under a
-- new run id, with the same key). Spec gate 5: "what collapses THAT is the episode row's own
-- work-key index" — the same work is one row, so it is one turn to every read, profile count and
-- compaction.
ALTER TABLE episodes ADD COLUMN work_key text;
CREATE UNIQUE INDEX episodes_work_key ON episodes (company, seat, work_key) WHERE work_key IS NOT NULL;

-- The run ids a row stands for besides its own (the redeliveries collapsed into it): GetEpisode,
-- a retried RecordEpisode and MarkEpisodesConsolidated find the row by any of them.
CREATE TABLE episode_runs (
    company     text NOT NULL,
    seat        text NOT NULL,
    turn_id     text NOT NULL,
    episode_id  uuid NOT NULL REFERENCES episodes (id) ON DELETE CASCADE,
    record_time timestamptz NOT NULL,
    PRIMARY KEY (company, seat, turn_id)
);
CREATE INDEX episode_runs_episode ON episode_runs (episode_id);
