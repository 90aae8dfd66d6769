-- The refresh ledger is bounded per seat (the newest learning.personal_memory.refresh_ledger_runs
-- runs of one seat, by seq), not per company: its eviction reads a seat's runs newest first.
CREATE INDEX refresh_ledger_runs_seat_newest ON refresh_ledger_runs (company, seat, seq DESC);
