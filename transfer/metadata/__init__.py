"""Where segment descriptors are published and found: the master's table, HTTP or etcd, and the
engine's cache of what it resolved."""
