"""Who may reach whom: the guards every cross-agent path passes first (``guard``: pure,
safe to import from workflow code), the one decision for every cross-agent path
(``gate.decide``: guards, membership, ACL, policy) and the review lifecycle with its
audit log (``reviews``).

May import ``baton.agents``, ``baton.grants``, ``baton.storage`` and the foundation modules.
"""
