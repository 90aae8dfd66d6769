-- `*_time` names throughout (issue 13, AIP-142): the skills' timestamp columns take the names their
-- proto fields already carry. Renames only: the view learning_health and the indexes follow the
-- columns (PostgreSQL binds them by column, not by name).
ALTER TABLE synthesized_skills RENAME COLUMN last_used_at TO last_used_time;
ALTER TABLE synthesized_skills RENAME COLUMN last_offered_at TO last_offered_time;
ALTER TABLE synthesized_skills RENAME COLUMN state_changed_at TO state_change_time;
ALTER TABLE synthesized_skills RENAME COLUMN created_at TO create_time;
ALTER TABLE synthesized_skills RENAME COLUMN updated_at TO update_time;
ALTER TABLE synthesized_skills RENAME COLUMN version_at TO version_time;
ALTER TABLE synthesized_skill_versions RENAME COLUMN created_at TO create_time;
ALTER TABLE synthesized_skill_versions RENAME COLUMN superseded_at TO supersede_time;
ALTER TABLE skill_use_requests RENAME COLUMN created_at TO create_time;
ALTER TABLE skill_proposals RENAME COLUMN created_at TO create_time;
ALTER TABLE skill_proposals RENAME COLUMN decided_at TO decide_time;
