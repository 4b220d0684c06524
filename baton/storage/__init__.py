"""Storage: the SQLModel tables and engine factory (``db``) and Alembic migrations (``migrate``).

May import the foundation modules (``baton.contracts``, ``baton.errors``, …) only.
"""
