-- knowledge_pages: the native knowledge backend's pages (team documents: runbooks, ADRs,
-- conventions, onboarding, tool skills, promotion drafts). A page lives in one container (a space)
-- of one company, is unique by title within it, and names its ancestors root first in
-- parent_titles. Each page keeps its own vector (pgvector), so the "knowledge_pages" index can be
-- rebuilt from here without one embedding call. The Auto-Drafted Skills subtree is stored like any
-- page; every seat's read excludes it.
--
-- The table moved here from the prefetch (its migrations 0002 and 0003, now empty). Written to be
-- idempotent: on a database the prefetch already migrated the table and its rows stay exactly as
-- they are; on a fresh one it is created here.
CREATE EXTENSION IF NOT EXISTS btree_gin;

CREATE TABLE IF NOT EXISTS knowledge_pages (
    id                    uuid PRIMARY KEY,
    company               text NOT NULL,
    container             text NOT NULL,
    title                 text NOT NULL,
    body                  text NOT NULL,
    parent_titles         text[] NOT NULL DEFAULT '{}',   -- ancestors' titles, root first
    create_time           timestamptz NOT NULL,
    update_time           timestamptz NOT NULL,
    embedding             vector,                          -- of title + body; NULL until embedded
    embedding_model       text,
    embedding_dims        int,
    indexed               boolean NOT NULL DEFAULT false,  -- the vector is in the index
    fill_held_until       timestamptz,
    fill_held_fingerprint text,
    fill_alone            boolean NOT NULL DEFAULT false,  -- once refused, offered alone
    -- The lexical half: a title lexeme is weighted A, a body lexeme B.
    tsv                   tsvector GENERATED ALWAYS AS (
                              setweight(to_tsvector('english', title), 'A')
                              || setweight(to_tsvector('english', body), 'B')) STORED,
    CONSTRAINT knowledge_pages_title_unique UNIQUE (company, container, title)
);

-- Lexical half: the container's keys inside the GIN index, so a match never walks other scopes.
CREATE INDEX IF NOT EXISTS knowledge_pages_scope_tsv ON knowledge_pages USING gin (company, container, tsv);
-- Fill: pages whose vector is not in the index yet.
CREATE INDEX IF NOT EXISTS knowledge_pages_unindexed ON knowledge_pages (company, container)
    WHERE embedding IS NOT NULL AND NOT indexed;
-- The fill's idle minute is an index probe (libs/common/vector_rows.py); it replaced the partial
-- index of pages without a vector.
CREATE INDEX IF NOT EXISTS knowledge_pages_fill ON knowledge_pages (embedding_model, embedding_dims, company, container);
DROP INDEX IF EXISTS knowledge_pages_unfilled;
-- Listings (ListPages) walk a company's pages in (container, title) order: the unique constraint's
-- index serves them.
