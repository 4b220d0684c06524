"""Webhooks: subscriptions to review, handoff and failure events, and their signed
deliveries (Standard Webhooks; docs/webhooks.md). ``subscriptions`` is the stored
resource, ``events`` turns a domain change into deliveries in the same transaction."""
