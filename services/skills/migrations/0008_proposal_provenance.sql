-- What a proposer recorded beyond the proposal's source (issue 17): the model and prompt version
-- that proposed it and the people it rests on (agentlearn.common.v1.Provenance JSON). An approval
-- carries it onto the live skill's provenance.
ALTER TABLE skill_proposals ADD COLUMN provenance jsonb NOT NULL DEFAULT '{}';
