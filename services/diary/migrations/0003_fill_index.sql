-- The fill's idle minute is an index probe: notes of another model or width (or none) are found
-- here without reading the table (libs/common/vector_rows.py).
CREATE INDEX agent_diary_fill ON agent_diary (embedding_model, embedding_dims, company, seat);
DROP INDEX agent_diary_unfilled;
