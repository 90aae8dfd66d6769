-- counterparty_profiles: what one observing seat has learned about one counterparty on one
-- platform. Private to the observer: every read is scoped to (company, observer), and two seats
-- observing the same person hold two rows, never merged.
CREATE TABLE counterparty_profiles (
    id                  uuid PRIMARY KEY,
    company             text NOT NULL,
    observer            text NOT NULL,
    platform            text NOT NULL,
    subject_key         text NOT NULL,               -- the handle, or the external id with no handle
    subject_handle      text,
    subject_external_id text,
    communication_style text NOT NULL DEFAULT '',
    past_decisions      text[] NOT NULL DEFAULT '{}', -- newest first, bounded by the service
    sensitivities       text[] NOT NULL DEFAULT '{}',
    topics              text[] NOT NULL DEFAULT '{}',
    observation_count   integer NOT NULL DEFAULT 0,
    create_time         timestamptz NOT NULL,
    update_time         timestamptz NOT NULL,
    last_turn_id        text,
    CHECK (subject_handle IS NOT NULL OR subject_external_id IS NOT NULL),
    -- Filed under the handle, or the external id with no handle; a row keyed by an external id may
    -- later learn the subject's handle, so the key is one of the two, not always the first.
    CHECK (subject_key IS NOT DISTINCT FROM subject_handle OR subject_key IS NOT DISTINCT FROM subject_external_id)
);

-- One profile per (observer, subject, platform); the upsert's conflict target.
CREATE UNIQUE INDEX counterparty_profiles_subject
    ON counterparty_profiles (company, observer, platform, subject_key);
-- ListProfiles: the observer's profiles, most recently updated first.
CREATE INDEX counterparty_profiles_observer_recent
    ON counterparty_profiles (company, observer, update_time DESC, id DESC);
