-- One reflection state machine (issue 13): `reflections.state` is the reflection's state and the
-- queue row's state its projection (services/reflector/domain.py: ReflectionState, TRANSITIONS).
-- The column takes only the machine's states.
ALTER TABLE reflections ADD CONSTRAINT reflections_state_known
    CHECK (state IN ('queued', 'running', 'retrying', 'deferred', 'completed', 'gated', 'dead_lettered'));

-- Before this, a turn whose payload could not be read was dead-lettered on the queue only, its
-- record left `queued` for ever: bring such records in step with their queue row.
UPDATE reflections r
SET state = 'dead_lettered', reason = j.reason, complete_time = j.finish_time, next_attempt_time = NULL
FROM background_jobs j
WHERE j.kind = 'reflection' AND j.state = 'dead' AND j.company = r.company AND j.seat = r.seat
  AND j.key = replace(replace(r.seat, '%', '%25'), '/', '%2F') || '/' || r.turn_id
  AND r.state NOT IN ('dead_lettered', 'completed', 'gated');
