"""The worker: client, data converter, registrations (shared by CLI, dev stack and tests)."""
