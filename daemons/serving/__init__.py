"""Serving completions: the conductor daemon, its HTTP front end, the service that schedules each
request onto prefill and decode workers, and the client and bench that drive it."""
