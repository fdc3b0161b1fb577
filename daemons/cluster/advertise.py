"""The address a daemon gives other hosts, and the start-up check that they can reach it.

A daemon binds ``bind_host`` and advertises ``advertise_address`` (default: ``bind_host``).
Advertising a loopback address to a peer on another host is the classic mistake of a first
multi-host deployment: everything starts, and nothing can connect. We refuse it at start.
"""

from __future__ import annotations

import ipaddress

from daemons.errors import AddressNotReachable
from transfer.etcd.kv import parse_endpoints
from transfer.etcd.leader import ETCD_SCHEME

_ANY = ("0.0.0.0", "::", "*", "")


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: assume it resolves to a routable address


def advertise_host(config) -> str:
    host = config.advertise_address or config.bind_host
    if host in _ANY:
        raise AddressNotReachable(f"bind_host {config.bind_host!r} listens on every interface but names none: "
                                  "set --advertise-address to the address other hosts should use")
    return host


def advertised(bound: str, config) -> str:
    """``tcp://<advertised host>:<bound port>`` for a server bound at ``bound``."""
    return f"tcp://{advertise_host(config)}:{bound.rpartition(':')[2]}"


def peer_hosts(master: str, etcd_endpoints: str = "") -> list[str]:
    """Hosts named by a master spec (address or etcd://...) and by etcd endpoints."""
    hosts = [h for h, _ in parse_endpoints(etcd_endpoints)] if etcd_endpoints else []
    if master.startswith(ETCD_SCHEME):
        hosts += [h for h, _ in parse_endpoints(master[len(ETCD_SCHEME):].partition("/")[0])]
    elif master:
        hosts.append(master.split("://")[-1].rpartition(":")[0])
    return hosts


def check_reachable(config, role: str) -> str:
    """The host this daemon advertises; refuses a loopback one when a peer is on another host."""
    host = advertise_host(config)
    remote = [p for p in peer_hosts(config.master, config.etcd_endpoints) if not is_loopback(p)]
    if is_loopback(host) and remote:
        raise AddressNotReachable(
            f"the {role} would advertise loopback address {host} to {remote[0]}, which is on another host "
            "and could not reach it: set --advertise-address (and --bind-host) to an address that host can reach")
    return host
