-- synthesized_skills: a seat's catalogue of learned procedures (agent-scope), and
-- synthesized_skill_versions: the bodies refinement replaced (bounded per skill).
CREATE TABLE synthesized_skills (
    id                    uuid PRIMARY KEY,
    company               text NOT NULL,
    seat                  text NOT NULL,
    name                  text NOT NULL,
    summary               text NOT NULL,
    body                  text NOT NULL,            -- SKILL.md, verbatim
    tool_sequence         text[] NOT NULL,          -- the representative run, in order
    trigger               text NOT NULL CHECK (trigger IN ('single', 'clustered')),
    cluster_size          int NOT NULL CHECK (cluster_size >= 1),
    source_turn_ids       text[] NOT NULL DEFAULT '{}',
    state                 text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'stale', 'archived')),
    pinned                boolean NOT NULL DEFAULT false,
    version               int NOT NULL DEFAULT 1,
    use_count             bigint NOT NULL DEFAULT 0,  -- UseSkill loads + the skill_use worker's offered skills
    last_used_at          timestamptz,
    last_offered_at       timestamptz,
    -- The staleness clock the curator reads: the latest of creation, use, offer and restore.
    unused_since          timestamptz NOT NULL,
    state_changed_at      timestamptz NOT NULL,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    -- The live version: when it became live and how (copied onto its version row when superseded).
    version_at            timestamptz NOT NULL,
    change                text NOT NULL DEFAULT 'created',
    change_reason         text NOT NULL DEFAULT '',
    restored_from_version int,
    request_id            text,                     -- the idempotency key of the call that made it
    UNIQUE (company, seat, name)
);

-- The curator's two set-based transitions: rows of one state by clock, pinned rows left out.
CREATE INDEX synthesized_skills_curator ON synthesized_skills (state, unused_since) WHERE NOT pinned;

CREATE TABLE synthesized_skill_versions (
    id                    bigserial PRIMARY KEY,
    skill_id              uuid NOT NULL REFERENCES synthesized_skills (id) ON DELETE CASCADE,
    version               int NOT NULL,
    body                  text NOT NULL,
    change                text NOT NULL,
    reason                text NOT NULL DEFAULT '',
    restored_from_version int,
    request_id            text,
    created_at            timestamptz NOT NULL,     -- when this version became live
    superseded_at         timestamptz NOT NULL,     -- when the next one replaced it
    UNIQUE (skill_id, version)
);
