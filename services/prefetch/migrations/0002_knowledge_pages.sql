-- Moved: knowledge_pages belongs to the knowledge service (services/knowledge/migrations/
-- 0001_knowledge_pages.sql, idempotent). This file keeps its number so a database that applied
-- it keeps its history; on a fresh database it does nothing.
SELECT 1;
