"""What humans define and what is kept: spec (TOML), criteria evaluation, ledger (SQLite), report (HTML)."""
