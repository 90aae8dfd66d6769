-- What a compacted row was folded from (issue 17): one row per member, written in the fold's
-- transaction. Provenance: a compacted row's turns and people are the union of its members' (run
-- ids with collapsed redeliveries, senders), with the model and prompt version of the compaction.
-- Erasure: a compacted row whose members included an erased person's turns is re-derived from its
-- remaining members by the same summary the lifecycle wrote (record = what that summary read of
-- the member, and the member's countable columns), or deleted when none remain. An erasure deletes
-- the person's member rows; a compacted row's deletion takes its members with it.
CREATE TABLE compaction_members (
    compacted_id uuid NOT NULL REFERENCES episodes (id) ON DELETE CASCADE,
    position     integer NOT NULL,
    company      text NOT NULL,
    turn_id      text NOT NULL DEFAULT '',
    runs         text[] NOT NULL DEFAULT '{}',
    subjects     text[] NOT NULL DEFAULT '{}',
    record       jsonb NOT NULL,
    PRIMARY KEY (compacted_id, position)
);
CREATE INDEX compaction_members_runs ON compaction_members USING gin (runs);
CREATE INDEX compaction_members_subjects ON compaction_members USING gin (subjects);

-- The model and prompt version that wrote a compacted row's summary ('' for rows folded before).
ALTER TABLE episodes ADD COLUMN compaction_model text NOT NULL DEFAULT '';
ALTER TABLE episodes ADD COLUMN compaction_prompt_version text NOT NULL DEFAULT '';
