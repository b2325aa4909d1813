"""Telegram service for a shared ParlAI model."""
