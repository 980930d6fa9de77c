"""The MCP server: every probe and the ledger as tools for outside agents."""
