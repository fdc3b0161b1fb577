"""The master's side of high availability: campaign on etcd, serve only while leading.

With ``ha_backend = etcd`` the master registers its store and metadata ops behind a
:class:`daemons.ha_election.LeaderGate`: as a standby (or a leader whose lease lapsed) it
answers them NOT_LEADER, which sends clients back to etcd to find the leader. Losing the lease
also throws the master's state away (see :mod:`daemons.ha_election` for why).
"""

from __future__ import annotations

from typing import Any, Callable

from daemons.advertise import advertised
from daemons.ha_election import Election, LeaderGate
from transfer.errors import NotLeader
from transfer.etcd_kv import EtcdKV


def start_election(daemon: Any, install_state: Callable[[Any], None]) -> Election:
    """Campaign for ``daemon`` (a MasterDaemon); ``install_state(server)`` registers fresh ops."""
    config = daemon.config
    address = advertised(daemon.server.address, config)
    election: Election | None = None

    def refuse() -> NotLeader:
        # No etcd lookup for a hint here: the handlers run on the RPC I/O thread.
        return NotLeader(f"master {address} does not lead cluster {config.cluster_id!r}")

    gate = LeaderGate(daemon.server, lambda: election is not None and election.leading, refuse)
    install_state(gate)
    election = Election(EtcdKV(config.etcd_endpoints, timeout=max(config.ha_lease_ttl / 5, 0.2)),
                        config.cluster_id, address, config.ha_lease_ttl,
                        on_deposed=lambda: install_state(gate))
    return election.start()

