-- Keys the whole deployment shares, created once by the first process that needs one and read by
-- every replica and every restart after it (the page tokens' HMAC key: a token minted by one
-- replica verifies on another). A configured secret (auth.page_token_secret) takes precedence.
CREATE TABLE deployment_keys (
    name        text PRIMARY KEY,
    key         bytea NOT NULL,
    create_time timestamptz NOT NULL
);
