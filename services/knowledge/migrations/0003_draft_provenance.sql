-- draft_provenance: where each promotion draft came from (issue 17): the unit, the converging
-- runs (seat and run id of each; sources), the model and prompt version of the distillation, the
-- writer (provenance, the agentlearn.common.v1.Provenance JSON). Keyed by the page the writer filed
-- (a native page's UUID, or a Confluence page id). Read by GetDraftProvenance and by an erasure
-- (a draft resting on a person's turns, or on an erased seat's, goes).
CREATE TABLE draft_provenance (
    company     text NOT NULL,
    page_id     text NOT NULL,
    backend     text NOT NULL,              -- "native" or "confluence": what holds the page
    container   text NOT NULL,
    title       text NOT NULL,
    unit        text NOT NULL,
    seats       text[] NOT NULL,
    turn_ids    text[] NOT NULL,
    sources     jsonb NOT NULL,             -- [{"seat": ..., "turn_id": ...}], the cluster's members
    provenance  jsonb NOT NULL,
    record_time timestamptz NOT NULL,
    PRIMARY KEY (company, page_id)
);

-- An erasure: the drafts resting on a person's run ids or on a seat.
CREATE INDEX draft_provenance_turns ON draft_provenance USING gin (turn_ids);
CREATE INDEX draft_provenance_seats ON draft_provenance USING gin (seats);
