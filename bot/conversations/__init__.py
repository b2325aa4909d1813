"""The use cases shared by Telegram and the terminal: one transaction per user action."""
