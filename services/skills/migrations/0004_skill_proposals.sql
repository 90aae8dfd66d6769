-- skill_proposals: skill candidates (session learning checks, the distill_skill builtin) waiting
-- for a person's approval; approved ones name the live skill they became, rejected ones suppress
-- matching candidates. The embedding of "name: summary" serves the semantic duplicate check.
CREATE TABLE skill_proposals (
    id               uuid PRIMARY KEY,
    company          text NOT NULL,
    seat             text NOT NULL,
    name             text NOT NULL,
    summary          text NOT NULL,
    body             text NOT NULL,
    tool_sequence    text[] NOT NULL,
    origin           text NOT NULL CHECK (origin IN ('session_check', 'distill_skill')),
    session_id       text NOT NULL DEFAULT '',
    check_id         text NOT NULL DEFAULT '',
    evidence_ids     text[] NOT NULL DEFAULT '{}',
    turn_id          text NOT NULL DEFAULT '',
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'approved', 'rejected')),
    request_id       text,
    embedding        vector,
    embedding_model  text,
    created_at       timestamptz NOT NULL,
    decided_at       timestamptz,
    decided_by       text NOT NULL DEFAULT '',
    decision_reason  text NOT NULL DEFAULT '',
    skill_id         uuid,
    UNIQUE (company, seat, request_id)
);
-- The seat's proposals, newest first (ListSkillProposals), and the duplicate checks' reads.
CREATE INDEX skill_proposals_seat ON skill_proposals (company, seat, created_at DESC, id DESC);
