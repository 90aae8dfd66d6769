-- Where each note came from (issue 17): the turns or session check it was written from, the people
-- whose messages it rests on (subjects: their handles or external ids), the model and prompt
-- version. A row per note, deleted with it; an erasure finds a person's notes by `subjects`.
CREATE TABLE note_provenance (
    note_id     uuid PRIMARY KEY REFERENCES agent_diary (id) ON DELETE CASCADE,
    company     text NOT NULL,
    seat        text NOT NULL,
    subjects    text[] NOT NULL DEFAULT '{}',
    provenance  jsonb NOT NULL,
    record_time timestamptz NOT NULL
);
CREATE INDEX note_provenance_subjects ON note_provenance USING gin (company, subjects);
