-- Caller credentials: bearer tokens bound to a company (and optionally a seat and/or a user) with
-- scopes. Only a SHA-256 digest of each token is kept; the token itself is shown once, at issue.
CREATE TABLE api_tokens (
    id            uuid PRIMARY KEY,
    digest        text NOT NULL UNIQUE,          -- sha256 hex of the whole token
    company       text NOT NULL,
    seat          text,                          -- NULL: any seat of the company
    user_handle   text,                          -- NULL: any user of the company
    scopes        text[] NOT NULL,
    name          text NOT NULL DEFAULT '',      -- an operator's label ("engine prod", "ana's laptop")
    create_time   timestamptz NOT NULL,
    expire_time   timestamptz,                   -- NULL: no expiry
    revoke_time   timestamptz,
    last_used_time timestamptz
);
CREATE INDEX api_tokens_company ON api_tokens (company, create_time DESC);
