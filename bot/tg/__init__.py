"""The Telegram layer, module by module along DESIGN.md's data flow.

- ingest.py: getUpdates polling or the webhook server, into the inbox, acknowledged after commit
- inbox_worker.py: pending inbox rows, one at a time per chat, chats in parallel
- handlers.py: commands and text -> ChatActions use cases (answers go to the outbox)
- delivery.py: the outbox to Telegram, rate limited, retried, long texts in parts
- backoff.py: retry delays shared by the above
- app.py: `python -m bot run`, wiring and start-up/shutdown order
"""
