"""Feedback instruments: each probe returns a Feedback (check, bench, record, gil, roofline)."""
