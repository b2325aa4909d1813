"""What tests (and bench/) share: the loopback Bot API, the in-process service, the bot
process, the tiny model, database helpers."""
