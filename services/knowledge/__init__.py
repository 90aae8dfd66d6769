"""The knowledge service (``agentlearn.knowledge.v1.KnowledgeService``): team pages behind the
``Searcher`` seam — native pages in PostgreSQL or Confluence — scoped to each reader, with the
Auto-Drafted Skills subtree hidden from seats, ``knowledge_read`` recorded for every read, the
vector fill, and cross-agent promotion. See ``docs/services/knowledge.md``."""
