-- Provenance of skills, their versions and their practice bullets (issue 17): where each came
-- from (turn ids and work key, the subjects whose messages it rests on, a learning check's session
-- and events, the model and prompt version, the writer), as agentlearn.common.v1.Provenance JSON
-- (libs.common.erasure.provenance_json). An erasure reads it to tell what rests only on the erased
-- person (removed) from what also rests on others (that person's part removed).
ALTER TABLE synthesized_skills ADD COLUMN provenance jsonb NOT NULL DEFAULT '{}';          -- the skill's draft
ALTER TABLE synthesized_skills ADD COLUMN version_provenance jsonb NOT NULL DEFAULT '{}';  -- the live version's
ALTER TABLE synthesized_skill_versions ADD COLUMN provenance jsonb NOT NULL DEFAULT '{}';

-- One row per bullet under "## What practice added": the body holds the text, this row where it
-- came from, so an erasure can take one person's bullets out and re-render the body without a model.
CREATE TABLE skill_practice_bullets (
    id          uuid PRIMARY KEY,
    skill_id    uuid NOT NULL REFERENCES synthesized_skills (id) ON DELETE CASCADE,
    version     int NOT NULL,              -- the version that appended it
    bullet      text NOT NULL,             -- its line, as written into the body
    provenance  jsonb NOT NULL DEFAULT '{}',
    create_time timestamptz NOT NULL
);
CREATE INDEX skill_practice_bullets_skill ON skill_practice_bullets (skill_id, version);
