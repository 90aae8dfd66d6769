-- The span an event was recorded in, beside its trace (libs/common/events.py): the spec correlates
-- a skill_used to the host turn "via trace_id / span_id". Nullable: rows written before it, and
-- events recorded with no span recording, have none. Adding a nullable column rewrites no row.
ALTER TABLE events ADD COLUMN span_id text;
