"""The prefill and decode worker daemons, what they share, and the typed messages between them."""
