-- GetLessonProvenance (issue 17): a workspace lesson found by the knowledge page it is filed as.
CREATE INDEX workspace_lessons_page ON workspace_lessons (company, page_id);
