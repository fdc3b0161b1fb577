"""etcd: the key-value client and following the elected master through it."""
