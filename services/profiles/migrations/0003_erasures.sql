-- The record of each erasure this service carried out (issue 17, libs/common/erasure.py): written
-- in the transaction that erased the rows, so a repeat of the same erasure (a retry, a resume after
-- a crash) returns the same report and erases nothing twice. Counts and ids only, never content.
CREATE TABLE profiles_erasures (
    erasure_id  uuid PRIMARY KEY,
    company     text NOT NULL,
    report      jsonb NOT NULL,
    erase_time  timestamptz NOT NULL
);
