"""Baton's HTTP API (FastAPI): ``/v1`` routers, problem+json, ``/mcp``, the web console at
``/ui``. Build it with :func:`api.app.create_app`.

Layer: an entry point above ``worker``. It may import ``worker`` (the Temporal client
connection) and everything below; only ``cli`` and ``worker.stack`` import it.
"""
