"""Baton's Alembic migrations: ``env.py``, the revision template and ``versions/``.

A package only so the revisions ship with Baton (``baton db upgrade`` works from
any folder and from a wheel). Drive it through :mod:`baton.storage.migrate` or
``baton db …``; there is no ``alembic.ini``.
"""
