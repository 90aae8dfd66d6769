-- The fill's idle minute is an index probe (libs/common/vector_rows.py).
CREATE INDEX knowledge_pages_fill ON knowledge_pages (embedding_model, embedding_dims, company, container);
DROP INDEX knowledge_pages_unfilled;
