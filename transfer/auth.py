"""The cluster secret, and the credentials every plane derives from it.

One random secret per cluster (``mooncake up`` writes it to ``<workdir>/secret``, mode 0600):

- the ZeroMQ control plane: one CURVE keypair derived from it; daemons are CURVE servers that
  admit only clients presenting that same public key (a ZAP handler checks it), so a client
  without the secret fails the handshake;
- unix:// control sockets and the TCP data plane: the server sends a random nonce, the client
  answers HMAC-SHA256(secret, purpose + nonce); a fresh nonce per connection means an answer
  overheard once is worth nothing later;
- the HTTP metadata server: a bearer token derived from the secret (never the secret itself, so
  a token seen in a proxy log does not open the other planes).

Each use derives its own key with a label, so a proof made for one plane never passes for
another. The secret itself is never logged or printed.

A *tenant credential* (:class:`TenantCredential`) gives a store client one tenant's keys and
nothing else. Its key is HMAC-SHA256(secret, "mooncake-tenant:" + name), so a master holding the
secret derives any tenant's key from the name alone and keeps no table of them; the holder proves
it with the same challenges as above, keyed by the tenant key, and names its tenant beside the
proof. Its text form, which ``mooncake tenant credential NAME`` prints, is

    mooncake-tenant-1:<tenant key, 64 hex>:<the daemons' CURVE public key, 40 z85>:<tenant>

(fixed widths up to the name, so any printable name parses). The daemons' public key is in it
because a CURVE client must know its server's key, and a tenant cannot derive it (a public key,
no secret: what admits a client is its own key). See :mod:`transfer.rpc.curve` and
:mod:`transfer.rpc.stream` for how servers bind a connection to the tenant it proved.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path

from transfer.errors import SettingError

SECRET_FILE = "secret"  # in the workdir, beside cluster.json
NONCE_BYTES = 16
MIN_SECRET_CHARS = 16
RPC_PURPOSE = b"mooncake-rpc"
TCP_DATA_PURPOSE = b"mooncake-tcp-data"
TENANT_LABEL = b"mooncake-tenant:"
CREDENTIAL_PREFIX = "mooncake-tenant-1:"
# The key (hex) and the daemons' public key (z85, whose alphabet has ':') have fixed widths.
_CREDENTIAL = re.compile(re.escape(CREDENTIAL_PREFIX) + r"([0-9a-f]{64}):(.{40}):(.+)", re.DOTALL)
# Longest tenant name a server derives a key for (store.tenants allows no longer one).
MAX_TENANT_NAME = 128
# Tenant credentials a server derived, by name: bounded, since any peer may name any tenant.
MAX_DERIVED_TENANTS = 4096


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def _curve_keypair_secret(key: bytes) -> bytes:
    """The z85 CURVE secret key of the keypair derived from ``key``."""
    from zmq.utils import z85  # here: the CLI resolves secrets without loading ZeroMQ

    return z85.encode(_hmac(key, b"mooncake-curve-keypair"))


def _curve_public(secret_key: bytes) -> bytes:
    import zmq

    return zmq.curve_public(secret_key)


class ClusterSecret:
    def __init__(self, value: str) -> None:
        value = value.strip()
        if len(value) < MIN_SECRET_CHARS:
            raise SettingError("cluster_secret", "(hidden)", f"a secret of at least {MIN_SECRET_CHARS} characters")
        self.value = value  # only for writing it to its file: never logged nor printed
        self._key = value.encode()
        self._tenants: dict[str, TenantCredential] = {}

    tenant = None  # the cluster's credential acts for every tenant

    def __repr__(self) -> str:
        return "ClusterSecret(<hidden>)"

    @functools.cached_property
    def curve_secret_key(self) -> bytes:
        """The CURVE secret key (z85) of the cluster's one keypair, which servers and clients
        share: holding it is what admits a client."""
        return _curve_keypair_secret(self._key)

    @functools.cached_property
    def curve_public_key(self) -> bytes:
        return _curve_public(self.curve_secret_key)

    @property
    def server_public_key(self) -> bytes:
        """The CURVE public key of the daemons a client of this credential talks to."""
        return self.curve_public_key

    def _derive(self, label: bytes) -> bytes:
        return _hmac(self._key, label)

    @functools.cached_property
    def grant_key(self) -> bytes:
        """What the master signs data-plane grants with and segment owners check them by
        (:mod:`transfer.grants`)."""
        return self._derive(b"mooncake-data-grant")

    def tenant_credential(self, tenant: str) -> TenantCredential:
        """``tenant``'s credential, derived from the secret (a checked tenant name)."""
        credential = self._tenants.get(tenant)
        if credential is None:
            if len(self._tenants) >= MAX_DERIVED_TENANTS:
                self._tenants.clear()
            credential = TenantCredential(tenant, self._derive(TENANT_LABEL + tenant.encode()),
                                          self.curve_public_key)
            self._tenants[tenant] = credential
        return credential

    def proof(self, purpose: bytes, nonce: bytes) -> bytes:
        """What a client answers to the server's ``nonce`` on a connection for ``purpose``."""
        return _hmac(self._key, purpose + nonce)

    def verify(self, purpose: bytes, nonce: bytes, proof: object) -> bool:
        return isinstance(proof, bytes) and hmac.compare_digest(self.proof(purpose, nonce), proof)

    @property
    def http_token(self) -> str:
        return self._derive(b"mooncake-http-metadata-token").hex()


class TenantCredential:
    """One tenant's credential: its name and key, and the daemons' CURVE public key. It offers
    what a client needs of a :class:`ClusterSecret` (proofs, a CURVE keypair), for that tenant
    only; a server holding one (a tenant process's own engine) admits that tenant's peers only."""

    def __init__(self, tenant: str, key: bytes, server_public_key: bytes) -> None:
        self.tenant, self._key, self.server_public_key = tenant, key, server_public_key

    def __repr__(self) -> str:
        return f"TenantCredential({self.tenant!r}, <hidden>)"

    @classmethod
    def parse(cls, text: str) -> TenantCredential:
        """The credential :attr:`text` wrote; SettingError (never quoting it) for anything else."""
        match = _CREDENTIAL.fullmatch(text.strip())
        if match is None:
            raise SettingError("tenant_credential", "(hidden)",
                               f"a credential of the form {CREDENTIAL_PREFIX}KEY:SERVERKEY:TENANT, as "
                               "`mooncake tenant credential NAME` prints it")
        key_hex, server_key, tenant = match.groups()
        return cls(tenant, bytes.fromhex(key_hex), server_key.encode())

    @property
    def text(self) -> str:
        """The form an admin hands to the tenant (never logged)."""
        return f"{CREDENTIAL_PREFIX}{self._key.hex()}:{self.server_public_key.decode()}:{self.tenant}"

    @functools.cached_property
    def curve_secret_key(self) -> bytes:
        return _curve_keypair_secret(self._key)

    @functools.cached_property
    def curve_public_key(self) -> bytes:
        return _curve_public(self.curve_secret_key)

    def proof(self, purpose: bytes, nonce: bytes) -> bytes:
        return _hmac(self._key, purpose + nonce)

    def verify(self, purpose: bytes, nonce: bytes, proof: object) -> bool:
        return isinstance(proof, bytes) and hmac.compare_digest(self.proof(purpose, nonce), proof)


Credential = ClusterSecret | TenantCredential


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def client_credential(config) -> Credential | None:
    """What a client presents: the tenant credential when the settings give one (it names the
    tenant the client acts for), else the cluster secret."""
    if config.tenant_credential:
        return TenantCredential.parse(config.tenant_credential)
    return cluster_secret(config)


def secret_file(workdir: str | os.PathLike) -> Path:
    return Path(workdir).expanduser() / SECRET_FILE


def read_secret_file(path: str | os.PathLike) -> ClusterSecret:
    try:
        return ClusterSecret(Path(path).read_text())
    except OSError as exc:
        raise SettingError("cluster_secret_file", str(path), f"a readable file ({exc.strerror})") from None


def cluster_secret(config) -> ClusterSecret | None:
    """The secret the settings name: ``cluster_secret`` (the value; MOONCAKE_CLUSTER_SECRET),
    else the file ``cluster_secret_file``, else ``<workdir>/secret`` when it exists. None: no
    secret anywhere, so authentication is off (a cluster `up` never started)."""
    if config.cluster_secret:
        return ClusterSecret(config.cluster_secret)
    if config.cluster_secret_file:
        return read_secret_file(config.cluster_secret_file)
    default = secret_file(config.workdir)
    return read_secret_file(default) if default.exists() else None


def create_secret_file(workdir: str | os.PathLike) -> Path:
    """Write a new random secret to ``<workdir>/secret`` unless one is there already: clients
    and consumers given the secret keep working across `down` and `up`."""
    path = secret_file(workdir)
    _write_new(path, secrets.token_urlsafe(32))
    return path


def keep_secret_file(config) -> None:
    """Record a secret the settings give (the environment or another file) as
    ``<workdir>/secret`` when the workdir has none, so later commands on this host (status, put,
    bench) find it without the environment. One already there is left alone: the given secret
    still wins for whoever is given it."""
    if config.cluster_secret:
        _write_new(secret_file(config.workdir), ClusterSecret(config.cluster_secret).value)
    elif config.cluster_secret_file:
        _write_new(secret_file(config.workdir), read_secret_file(config.cluster_secret_file).value)


def _write_new(path: Path, value: str) -> None:
    """Create ``path`` holding ``value``, 0600 from the start (never readable by others, not even
    for a moment); nothing when it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")
