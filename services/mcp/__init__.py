"""``./run mcp``: an MCP server (stdio or streamable HTTP) in front of a running agentlearn."""
