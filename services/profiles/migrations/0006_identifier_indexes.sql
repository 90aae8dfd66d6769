-- A row by its handle and by its external id, as the unique index finds it by its key: ListProfiles
-- finds the other rows of the people on a page through these (the rows sharing an identifier on
-- the platform), rather than grouping all the observer's rows on every page; an upsert's lookup of
-- a subject's rows by either identifier uses them too.
CREATE INDEX counterparty_profiles_handle
    ON counterparty_profiles (company, observer, platform, subject_handle) WHERE subject_handle IS NOT NULL;
CREATE INDEX counterparty_profiles_external_id
    ON counterparty_profiles (company, observer, platform, subject_external_id) WHERE subject_external_id IS NOT NULL;
