"""The master's KV events: what it records (recorder), says (messages) and sends (publisher)."""
