-- Moved with 0002: the knowledge service's migration creates knowledge_pages_fill and drops
-- knowledge_pages_unfilled. Kept so the prefetch's migration numbers stay as they shipped.
SELECT 1;
