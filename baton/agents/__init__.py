"""What an agent is: the authored spec (``spec``), the registry of revisions and live
pointers (``registry``), the layers ``extends`` folds (``layers``), teams, the delegation
roster, ordinary tools and ``baton apply``.

May import ``baton.grants``, ``baton.storage`` and the foundation modules.
"""
