-- The read side of the shared event log (services/telemetry): its aggregations filter a company's
-- events of one kind over a window (hit rates, spend per purpose) and walk a company's seats in
-- handle order. The writers' own indexes (kind, time) and (company, seat, time) stay.
CREATE INDEX IF NOT EXISTS events_company_kind_time ON events (company, kind, time DESC);
