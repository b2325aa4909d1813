"""Admin tools: queries over the conversation database and the `admin` CLI."""
