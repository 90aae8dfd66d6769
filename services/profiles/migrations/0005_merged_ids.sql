-- The ids of the rows an upsert folded into this one (two rows of one person written before an
-- upsert found a row by either identifier: domain.combine): GetProfileProvenance of an id a caller
-- held before the fold answers the person's row it went into, rather than NOT_FOUND. Ids only;
-- they go with the row (an erasure deletes it).
ALTER TABLE counterparty_profiles ADD COLUMN merged_ids uuid[] NOT NULL DEFAULT '{}';
