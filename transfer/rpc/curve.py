"""ZeroMQ CURVE for the control plane: every daemon's ROUTER is a CURVE server, and its clients
must hold the cluster's keypair (:class:`transfer.auth.ClusterSecret`).

CURVE (libsodium, built into libzmq) encrypts and authenticates every message; a client that does
not know the server's public key fails the handshake, and one that does but presents another
client key is refused by the ZAP handler below, which admits only the cluster's own public key.
ZeroMQ drops a failed handshake silently, so the client only sees its deadline pass: its
RpcTimeout says to check the secret, and the server logs the refusal from a monitor socket
(ZeroMQ tells the server which listener refused a handshake and why, but not the peer address).
"""

from __future__ import annotations

import logging
import threading

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

from transfer.auth import ClusterSecret
from transfer.rpc.log_throttle import LogThrottle

log = logging.getLogger(__name__)

# Not EVENT_HANDSHAKE_FAILED_NO_DETAIL: that is a peer leaving mid-handshake, whoever it is.
HANDSHAKE_FAILURES = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
_REASONS = {
    int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH): "the client does not use CURVE (it has no cluster secret)",
    int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC): "the client's keys do not match (a wrong cluster secret)",
}


class _ClusterKeys:
    """ZAP's credentials provider: a domain (one per cluster public key) admits that key only."""

    def __init__(self) -> None:
        self.allowed: dict[str, bytes] = {}

    def callback(self, domain: str, key: bytes) -> bool:
        return self.allowed.get(domain) == key


# One ZAP handler per ZeroMQ context (ZeroMQ asks whoever binds inproc://zeromq.zap.01 in the
# server socket's context); started with the context's first CURVE server, living as long as
# the context does (Context.instance() lives as long as the process).
_authenticators: dict[zmq.Context, tuple[ThreadAuthenticator, _ClusterKeys]] = {}
_lock = threading.Lock()


def _domain(secret: ClusterSecret) -> str:
    return "mooncake-" + secret.curve_public_key.decode()


def make_server(sock: zmq.Socket, context: zmq.Context, secret: ClusterSecret,
                monitor: bool = True) -> zmq.Socket | None:
    """Make ``sock`` (before it binds) a CURVE server admitting only the cluster's key; returns
    the monitor socket its handshake failures arrive on (see :class:`RefusalLog`) if asked."""
    with _lock:
        if context not in _authenticators:
            authenticator = ThreadAuthenticator(context, log=logging.getLogger("transfer.rpc.zap"))
            authenticator.start()
            _authenticators[context] = authenticator, _ClusterKeys()
        authenticator, keys = _authenticators[context]
        domain = _domain(secret)
        if domain not in keys.allowed:
            keys.allowed[domain] = secret.curve_public_key
            authenticator.configure_curve_callback(domain, keys)
    sock.zap_domain = domain.encode()
    sock.curve_server = True
    sock.curve_secretkey = secret.curve_secret_key
    return sock.get_monitor_socket(HANDSHAKE_FAILURES) if monitor else None


def make_client(sock: zmq.Socket, secret: ClusterSecret) -> None:
    """Make ``sock`` (before it connects) a CURVE client holding the cluster's keypair."""
    sock.curve_serverkey = secret.curve_public_key
    sock.curve_publickey = secret.curve_public_key
    sock.curve_secretkey = secret.curve_secret_key


class RefusalLog:
    """Reads a CURVE server's monitor socket and logs its refused handshakes, one line per kind
    of failure per interval: a client that retries every 100 ms must not fill the log."""

    def __init__(self, monitor: zmq.Socket) -> None:
        self.monitor = monitor
        self.num_refused = 0
        self._throttle = LogThrottle(log)

    def read(self) -> None:
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)
            self.num_refused += 1
            value = int(event["value"])
            reason = _REASONS.get(value) or (
                "the ZAP handler refused its key (not the cluster's)"
                if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH else f"handshake error {value}")
            endpoint = event["endpoint"].decode(errors="replace")
            self._throttle.warning((endpoint, value), "refused a control connection on %s: %s",
                                   endpoint, reason)

    def close(self, sock: zmq.Socket) -> None:
        sock.disable_monitor()
        self.monitor.close(linger=0)
