"""The engine: one shared ParlAI model, cloned agents per conversation, batched generation."""

from bot.inference import compat

# Before anything imports ParlAI (persona.py does at import time), so its import-time warnings
# and torch incompatibilities are handled everywhere.
compat.apply()
