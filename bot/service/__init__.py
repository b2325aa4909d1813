"""The queue runtime: inbox, per-chat pool, leases, heartbeats and fencing, delivery,
the retry policy, retention, metrics and health endpoints."""
