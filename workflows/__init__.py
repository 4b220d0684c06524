"""Temporal workflow definitions (deterministic code only: no I/O, no settings, no clock)."""
