-- learning_health: the per-seat rollup of the telemetry harness. Query it directly
-- (SELECT * FROM learning_health WHERE company = ... AND seat = ...).
--
-- Ages are measured against now(), or against the setting agentlearn.now when a session sets it
-- (the service sets it to its own clock, so ages agree with every other horizon it computes).
-- Every skill of the seat counts, archived ones included: the curator archiving unused skills must
-- not make a library look healthier than it was.
CREATE VIEW learning_health AS
SELECT
    company,
    seat,
    count(*)                                         AS total_skills,
    count(*) FILTER (WHERE use_count > 0)            AS skills_used_at_least_once,
    coalesce(sum(use_count), 0)::bigint              AS total_skill_uses,
    max(last_used_at)                                AS most_recent_skill_use,
    (coalesce(sum(use_count), 0)::double precision / count(*))  AS avg_uses_per_skill,
    avg(extract(epoch FROM (coalesce(nullif(current_setting('agentlearn.now', true), '')::timestamptz, now())
                            - created_at)) / 86400.0)::double precision AS avg_skill_age_days,
    count(*) FILTER (WHERE state = 'active')         AS active_skills,
    count(*) FILTER (WHERE state = 'stale')          AS stale_skills,
    count(*) FILTER (WHERE state = 'archived')       AS archived_skills
FROM synthesized_skills
GROUP BY company, seat;
