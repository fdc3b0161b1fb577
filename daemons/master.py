"""The master daemon: the cluster's metadata authority.

Today it serves the transfer engine's segment-descriptor metadata service; the store's object
metadata (segments, replicas, leases, eviction) joins it with the store.
"""

from __future__ import annotations

from daemons.base import Daemon


class MasterDaemon(Daemon):
    role = "master"
