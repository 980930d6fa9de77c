"""The report: a run (or one probe) read back as data and drawn as a self-contained HTML page."""
