"""ZeroMQ CURVE for the control plane: every daemon's ROUTER is a CURVE server, and its clients
must hold the cluster's keypair (:class:`transfer.auth.ClusterSecret`).

CURVE (libsodium, built into libzmq) encrypts and authenticates every message; a client that does
not know the server's public key fails the handshake, and one that does but presents another
client key is refused by the ZAP handler below, which admits only the cluster's own public key.
ZeroMQ drops a failed handshake silently, so the client only sees its deadline pass: its
RpcTimeout says to check the secret, and the server logs the refusal from a monitor socket
(ZeroMQ tells the server which listener refused a handshake and why, but not the peer address).

Tenants (:class:`transfer.auth.TenantCredential`). A server that admits tenants (the master)
cannot tell in its ZAP handler which tenant a client key belongs to: a tenant's public key is
derived from its secret key, which is derived from the cluster secret and the tenant's name, and
a ZAP request carries only the key (its "identity" frame is the *server* socket's routing id, not
the client's, so a client cannot name itself there). So the ZAP handler of such a server admits
every key that completes the CURVE handshake, and each message is bound to its sender's key
instead: ZeroMQ stamps every message it received on a connection with the ZAP User-Id of that
connection, which pyzmq's authenticator sets to the client's public key (z85), and which the
peer cannot forge, since the key is what CURVE authenticated. A tenant client names its tenant
in each request header; the server derives that tenant's public key from the cluster secret and
serves the request for that tenant only if it is the key the message came with
(:func:`sender`); the cluster's own key acts for every tenant. A key that is neither (anybody
who read the daemons' public key off a tenant credential) gets UNAUTHORIZED for every request.
A server that does not admit tenants keeps the ZAP allow-list of the cluster key alone.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import zmq

from transfer.auth import MAX_TENANT_NAME, ClusterSecret, Credential
from transfer.errors import Unauthorized
from transfer.rpc.log_throttle import LogThrottle

if TYPE_CHECKING:
    from zmq.auth.thread import ThreadAuthenticator

log = logging.getLogger(__name__)

# Not EVENT_HANDSHAKE_FAILED_NO_DETAIL: that is a peer leaving mid-handshake, whoever it is.
HANDSHAKE_FAILURES = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
_REASONS = {
    int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH): "the client does not use CURVE (it has no cluster secret)",
    int(zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC): "the client's keys do not match (a wrong cluster secret)",
}


class _ClusterKeys:
    """ZAP's credentials provider: a domain (one per cluster public key) admits that key only;
    a tenants' domain admits any key, its messages checked one by one (:func:`sender`)."""

    def __init__(self) -> None:
        self.allowed: dict[str, bytes | None] = {}  # None: any key

    def callback(self, domain: str, key: bytes) -> bool:
        allowed = self.allowed.get(domain, b"")
        return allowed is None or allowed == key


# One ZAP handler per ZeroMQ context (ZeroMQ asks whoever binds inproc://zeromq.zap.01 in the
# server socket's context); started with the context's first CURVE server, living as long as
# the context does (Context.instance() lives as long as the process).
_authenticators: dict[zmq.Context, tuple[ThreadAuthenticator, _ClusterKeys]] = {}
_lock = threading.Lock()


def _domain(secret: Credential, admits_tenants: bool) -> str:
    return ("mooncake-tenants-" if admits_tenants else "mooncake-") + secret.curve_public_key.decode()


def make_server(sock: zmq.Socket, context: zmq.Context, secret: Credential,
                monitor: bool = True, admits_tenants: bool = False) -> zmq.Socket | None:
    """Make ``sock`` (before it binds) a CURVE server admitting only the key of ``secret`` (the
    cluster's, or a tenant's for a tenant process's own server), or with ``admits_tenants`` any
    key, whose messages :func:`sender` then checks; returns the monitor socket its handshake
    failures arrive on (see :class:`RefusalLog`) if asked."""
    # Imported here, not at the top: pyzmq's authenticator and monitor bring asyncio (about 15 ms),
    # which a client (every `mooncake get` or `exists`) does not need.
    from zmq.auth.thread import ThreadAuthenticator

    with _lock:
        if context not in _authenticators:
            authenticator = ThreadAuthenticator(context, log=logging.getLogger("transfer.rpc.zap"))
            authenticator.start()
            _authenticators[context] = authenticator, _ClusterKeys()
        authenticator, keys = _authenticators[context]
        domain = _domain(secret, admits_tenants)
        if domain not in keys.allowed:
            keys.allowed[domain] = None if admits_tenants else secret.curve_public_key
            authenticator.configure_curve_callback(domain, keys)
    sock.zap_domain = domain.encode()
    sock.curve_server = True
    sock.curve_secretkey = secret.curve_secret_key
    return sock.get_monitor_socket(HANDSHAKE_FAILURES) if monitor else None


def make_client(sock: zmq.Socket, secret: Credential) -> None:
    """Make ``sock`` (before it connects) a CURVE client holding the keypair of ``secret``."""
    sock.curve_serverkey = secret.server_public_key
    sock.curve_publickey = secret.curve_public_key
    sock.curve_secretkey = secret.curve_secret_key


def sender(secret: ClusterSecret, user_id: str, tenant: object) -> str | None:
    """Who sent a message that came with ZAP User-Id ``user_id`` (its sender's public key) and
    names ``tenant`` in its header: None for the cluster's key (it acts for everyone), else the
    tenant whose derived key it is; Unauthorized for any other key."""
    if user_id == secret.curve_public_key.decode():
        return None
    if not isinstance(tenant, str) or not tenant or len(tenant) > MAX_TENANT_NAME:
        raise Unauthorized("this connection's key is not the cluster's and its request names no tenant "
                           "(give the client the cluster secret or a tenant credential)")
    if secret.tenant_credential(tenant).curve_public_key.decode() != user_id:
        raise Unauthorized(f"this connection's key is not the key of tenant {tenant!r} (a credential of "
                           "another tenant, or of another cluster's secret)")
    return tenant


class RefusalLog:
    """Reads a CURVE server's monitor socket and logs its refused handshakes, one line per kind
    of failure per interval: a client that retries every 100 ms must not fill the log."""

    def __init__(self, monitor: zmq.Socket) -> None:
        self.monitor = monitor
        self.num_refused = 0
        self._throttle = LogThrottle(log)

    def read(self) -> None:
        from zmq.utils.monitor import recv_monitor_message  # see make_server

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
