"""The engine: one shared ParlAI model, cloned agents per conversation, batched generation."""
