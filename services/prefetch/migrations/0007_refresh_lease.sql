-- refresh_memory's one-at-a-time guard is a lease on the run's ledger row: who holds it
-- (lease_holder, a token per call) and until when (busy_until, the database's clock). A call takes
-- it with one UPDATE and clears it when done; a crashed holder's lease lapses at busy_until. It
-- replaces a transaction-level advisory lock held on a pooled connection for the whole call
-- (through the filter's model call), which left every other tenant's refreshes queued behind one
-- tenant's. Nullable and unread by the previous release: additive.
ALTER TABLE refresh_ledger_runs
    ADD COLUMN busy_until timestamptz,
    ADD COLUMN lease_holder uuid;
