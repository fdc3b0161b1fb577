"""What an operator watches a daemon through: its HTTP server (Prometheus /metrics, and the
master's health, role and inspection endpoints) and the collectors that read live state at
scrape time."""
