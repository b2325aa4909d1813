"""The Telegram layer: what talks to the Bot API (docs/architecture.md follows a text message).

- ingest.py: getUpdates polling or the webhook server, into the inbox, acknowledged after commit
- api_request.py: the Bot API client (python-telegram-bot's), reading answers with a depth bound
- aiohttp_request.py: python-telegram-bot's request interface on aiohttp, the Bot API's transport
- poller.py: which replica polls getUpdates (one per token), elected through the database
- handlers.py: commands and text -> the conversation use cases (answers go to the outbox)
- runner.py: one inbox row through the handlers, in one Turn (the inbox worker's `handle`)
- feedback.py: the 👍/👎 and rating buttons and their callback data
- drafts.py: streamed drafts (`sendMessageDraft`) while a reply generates
- flood.py: the per-chat flood gate

The inbox worker, delivery, leases and retries are in bot/service/; the wiring is bot/app.py
(build_service), the running service bot/runtime.py.
"""
