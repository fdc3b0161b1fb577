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
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import secrets
from pathlib import Path

from transfer.errors import SettingError

SECRET_FILE = "secret"  # in the workdir, beside cluster.json
NONCE_BYTES = 16
MIN_SECRET_CHARS = 16
RPC_PURPOSE = b"mooncake-rpc"
TCP_DATA_PURPOSE = b"mooncake-tcp-data"


class ClusterSecret:
    def __init__(self, value: str) -> None:
        value = value.strip()
        if len(value) < MIN_SECRET_CHARS:
            raise SettingError("cluster_secret", "(hidden)", f"a secret of at least {MIN_SECRET_CHARS} characters")
        self.value = value  # only for writing it to its file: never logged nor printed
        self._key = value.encode()

    def __repr__(self) -> str:
        return "ClusterSecret(<hidden>)"

    @functools.cached_property
    def curve_secret_key(self) -> bytes:
        """The CURVE secret key (z85) of the cluster's one keypair, which servers and clients
        share: holding it is what admits a client."""
        from zmq.utils import z85  # here: the CLI resolves secrets without loading ZeroMQ

        return z85.encode(self._derive(b"mooncake-curve-keypair"))

    @functools.cached_property
    def curve_public_key(self) -> bytes:
        import zmq

        return zmq.curve_public(self.curve_secret_key)

    def _derive(self, label: bytes) -> bytes:
        return hmac.new(self._key, label, hashlib.sha256).digest()

    def proof(self, purpose: bytes, nonce: bytes) -> bytes:
        """What a client answers to the server's ``nonce`` on a connection for ``purpose``."""
        return hmac.new(self._key, purpose + nonce, hashlib.sha256).digest()

    def verify(self, purpose: bytes, nonce: bytes, proof: object) -> bool:
        return isinstance(proof, bytes) and hmac.compare_digest(self.proof(purpose, nonce), proof)

    @property
    def http_token(self) -> str:
        return self._derive(b"mooncake-http-metadata-token").hex()


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


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
