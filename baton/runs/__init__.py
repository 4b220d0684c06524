"""The records of a run: session rows, transcripts and events (``session_store``), the run
tree with its limits and trace (``run_tree``), metering, launching sessions through the
Temporal client (``launch``), external sessions, inquiries and step deliverables.

May import every other ``baton`` layer; nothing in ``baton`` imports it back.
"""
