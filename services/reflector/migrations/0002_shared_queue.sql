-- The reflector's jobs move onto the shared queue (common 0004_background_jobs, kind 'reflection'),
-- and a run id is one seat's: the job key and the record's key name the seat too, so a seat that
-- submits another seat's run id gets its own reflection, not the other seat's state.
-- The job key is `<seat with % and / escaped>/<run id>` (services/reflector/domain.py: job_key).
INSERT INTO background_jobs (kind, key, company, seat, payload, trace_carrier, state, attempts, run_after,
                             locked_by, locked_until, create_time, finish_time)
SELECT kind,
       CASE WHEN kind = 'reflection'
            THEN replace(replace(seat, '%', '%25'), '/', '%2F') || '/' || key
            ELSE key END,
       company, seat, payload, trace_carrier, state, attempts, run_after, locked_by, locked_until,
       create_time, finish_time
FROM reflection_jobs
ON CONFLICT (kind, company, key) DO NOTHING;
DROP TABLE reflection_jobs;

ALTER TABLE reflections DROP CONSTRAINT reflections_pkey;
ALTER TABLE reflections ADD PRIMARY KEY (company, seat, turn_id);

-- Where a turn stands between attempts: why it is retrying or was dead-lettered, and when it runs
-- again (retrying, deferred).
ALTER TABLE reflections ADD COLUMN reason text;
ALTER TABLE reflections ADD COLUMN next_attempt_time timestamptz;
