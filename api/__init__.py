"""Baton's HTTP API (FastAPI). Build it with :func:`api.app.create_app`."""
