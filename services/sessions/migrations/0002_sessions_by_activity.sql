-- ListSessions: a company's sessions, most recently active first (the inspector's index).
CREATE INDEX IF NOT EXISTS chat_sessions_activity ON chat_sessions (company, update_time DESC, session_id DESC);
