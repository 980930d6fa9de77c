"""The live dashboard over the ledger: reads lab and report, nothing reads it."""
