-- profile_observations: every observation merged into a counterparty profile, with where it came
-- from (issue 17): the turn (run id, work key), the people whose messages it was derived from, the
-- model, the prompt version, the writer (provenance, the agentlearn.common.v1.Provenance JSON),
-- and the entries it stated, so an entry of the profile can be followed back to the turn that
-- added it. Written in the transaction of the merge; goes with its profile.
CREATE TABLE profile_observations (
    id                  uuid PRIMARY KEY,
    profile_id          uuid NOT NULL REFERENCES counterparty_profiles (id) ON DELETE CASCADE,
    company             text NOT NULL,
    observer            text NOT NULL,
    turn_id             text,
    subjects            text[] NOT NULL DEFAULT '{}', -- handles and external ids it rests on (erasure)
    provenance          jsonb NOT NULL,
    communication_style text NOT NULL DEFAULT '',
    past_decisions      text[] NOT NULL DEFAULT '{}',
    sensitivities       text[] NOT NULL DEFAULT '{}',
    topics              text[] NOT NULL DEFAULT '{}',
    observe_time        timestamptz NOT NULL
);

-- GetProfileProvenance: a profile's observations, newest first.
CREATE INDEX profile_observations_profile ON profile_observations (profile_id, observe_time DESC, id DESC);
-- An erasure: the observations resting on a person.
CREATE INDEX profile_observations_subjects ON profile_observations USING gin (subjects);
