-- Rounds (issue 17): an erasure whose verification finds rows written after its erase step (a
-- reflection of the person that was running) erases again, up to a bounded number of rounds; the
-- round it is in is kept so that a resume after a crash continues that round. Reports of later
-- rounds are kept under "<owner>#<round>" in reports and folded into one per owner in the receipt.
-- pending_checks names the verification checks that could not run (a vector index that was down).
ALTER TABLE erasures ADD COLUMN round integer NOT NULL DEFAULT 1;
ALTER TABLE erasures ADD COLUMN pending_checks text[] NOT NULL DEFAULT '{}';
