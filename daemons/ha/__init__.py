"""High availability: masters elect a leader on etcd, the leader journals its operations there, and
the failover scenario `mooncake bench failover` runs."""
