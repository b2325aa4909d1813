"""The Telegram layer: ingest, per-chat sequencing, handlers and delivery."""
