-- Idempotent writes: a retried WriteNote with the same request_id finds the note it wrote.
ALTER TABLE agent_diary ADD COLUMN request_id text;
CREATE UNIQUE INDEX agent_diary_request_id ON agent_diary (company, seat, request_id) WHERE request_id IS NOT NULL;
