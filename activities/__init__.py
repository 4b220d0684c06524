"""Temporal activities: every side effect of a session (DB, model calls, tools)."""
