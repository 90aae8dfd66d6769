-- BuildTurnContext is frozen per run id (spec: "Frozen at turn start"): the rendered context of
-- (company, seat, turn_id) is kept, so a second call for the same run — a self_iterate round, a
-- retried call, another replica — is answered with the same blocks and runs no model call and
-- counts no note use again. 'building' is a claim: a concurrent call for the same run waits for it
-- rather than building a second context. Kept learning.prefetch.frozen_context_hours after the
-- build (the pruning is bounded per call and ordered by create_time).
CREATE TABLE turn_contexts (
    company      text NOT NULL,
    seat         text NOT NULL,
    turn_id      text NOT NULL,
    state        text NOT NULL CHECK (state IN ('building', 'built')),
    context      jsonb,
    claim_time   timestamptz NOT NULL,
    create_time  timestamptz NOT NULL,
    PRIMARY KEY (company, seat, turn_id),
    CHECK (state = 'building' OR context IS NOT NULL)
);
CREATE INDEX turn_contexts_age ON turn_contexts (create_time);
