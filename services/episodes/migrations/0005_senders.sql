-- Each sender of a raw row's turn as one person, every identifier in its own field (a JSON array of
-- {"handle", "external_id", "platform"}; RecordEpisode's `senders`): GetEpisodeProvenance answers
-- them. `subjects` keeps every identifier flat, as erasure finds rows by. A compaction keeps its
-- members' senders beside their subjects. '[]': recorded before, or by a caller that named only
-- `subjects` (the provenance then answers each such identifier as a handle).
ALTER TABLE episodes ADD COLUMN senders jsonb NOT NULL DEFAULT '[]';
ALTER TABLE compaction_members ADD COLUMN senders jsonb NOT NULL DEFAULT '[]';
