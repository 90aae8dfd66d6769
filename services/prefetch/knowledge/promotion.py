"""The native backend's side of the ``PromotionWriter`` seam (spec: "Cross-agent promotion").

The port itself is the skills service's (``services/skills/promotion.py``: the promotion pass
calls it); it is re-exported here beside the writer that files drafts as native pages. Nothing
calls the writer yet: the promotion pass comes later.

How the native writer keeps the rules the port states:

- The draft is filed in the unit's container under the container's ``Auto-Drafted Skills`` page
  (``parent_titles = ["Auto-Drafted Skills"]``), which it creates when missing, so every search
  excludes it until a lead moves it out (an ``UpsertPage`` with other parents).
- Dedup is by title, unique within a container: a page of that title already there (a draft from
  an earlier tick, or one a lead published) is answered with ``created`` False and left untouched.
- The title is not given the ``[Auto-draft]`` prefix: this backend has a parent chain, and a
  prefix would keep a page a lead published out of every search.
"""

from __future__ import annotations

from services.prefetch.knowledge.domain import AUTO_DRAFTED_PARENT
from services.prefetch.knowledge.service import KnowledgeService
from services.skills.promotion import PromotionDraft, PromotionResult, PromotionWriter

__all__ = ["NativePromotionWriter", "PromotionDraft", "PromotionResult", "PromotionWriter"]

PARENT_BODY = (
    "Drafts distilled from procedures several agents of this unit converged on. They are hidden from "
    "every agent's knowledge search until a lead reviews one and moves it out of this page; delete a "
    "draft to reject it."
)


class NativePromotionWriter:
    def __init__(self, service: KnowledgeService):
        self._service = service

    async def write_draft(self, draft: PromotionDraft) -> PromotionResult:
        store = self._service.store
        existing = await store.by_title(draft.company, draft.container_key, draft.title)
        if existing is not None:
            return PromotionResult(page_id=str(existing.id), page_title=existing.title, created=False)
        if await store.by_title(draft.company, draft.container_key, AUTO_DRAFTED_PARENT) is None:
            await self._service.upsert_page(draft.company, draft.container_key, AUTO_DRAFTED_PARENT, PARENT_BODY, [])
        page, created, _ = await self._service.upsert_page(
            draft.company, draft.container_key, draft.title, draft.body, [AUTO_DRAFTED_PARENT]
        )
        return PromotionResult(page_id=str(page.id), page_title=page.title, created=created)
