"""Tenants: one key namespace and one byte quota each, inside one pool.

Pure: no I/O, no clock. The master keeps every object under its *scoped key*: a key of tenant
``default`` is itself (so clients that name no tenant, KV-event subscribers and files written
before tenants existed see what they always saw), and a key of any other tenant is
``"<tenant>\\0<key>"``, as in Mooncake's ``TenantId::MakeScopedKey``. NUL may not appear in a
client's key, so no key of one tenant can spell a key of another. Tenant names follow Mooncake's
``TenantId::IsValid``: printable ASCII, not starting with ``_`` (reserved).

:class:`TenantLedger` counts what each tenant holds and bounds it by its quota. What is counted:
the object's size once per *memory* range held for it (complete replicas, a put in flight, a copy
being written, a promotion from disk), as Mooncake charges ``size x replicas`` of the memory
tier; disk replicas cost nothing here (the SSD tier has its own limit, the disk). Quotas come
from the settings (``tenant_quotas``, ``default_tenant_quota``; 0 is unlimited) and may be
changed at run time (``store.set_tenant_quota``).
"""

from __future__ import annotations

from store.errors import InvalidParams
from transfer.settings import parse_size

DEFAULT_TENANT = "default"
KEY_SEPARATOR = "\0"
MAX_TENANT_LENGTH = 128  # bytes; the name travels with every call and prefixes every key


def check_tenant(tenant: object) -> str:
    """``tenant`` if it is a valid tenant name, else InvalidParams."""
    if tenant == DEFAULT_TENANT:  # what nearly every request acts for: its check costs a 4 KiB put ~2%
        return DEFAULT_TENANT
    if not isinstance(tenant, str) or not tenant or len(tenant) > MAX_TENANT_LENGTH:
        raise InvalidParams(f"a tenant is a name of 1 to {MAX_TENANT_LENGTH} characters, got {tenant!r:.200}")
    if tenant[0] == "_" or not all(" " <= c <= "~" for c in tenant):
        raise InvalidParams(f"tenant {tenant!r:.200}: printable ASCII only, and a leading '_' is reserved")
    return tenant


def scoped_key(tenant: str, key: str) -> str:
    """The master's key for ``key`` of ``tenant`` (a checked tenant name)."""
    if KEY_SEPARATOR in key:
        raise InvalidParams("a key may not contain NUL (it separates a tenant from its keys)")
    return key if tenant == DEFAULT_TENANT else f"{tenant}{KEY_SEPARATOR}{key}"


def scoped_keys(tenant: str, keys: list[str]) -> list[str]:
    """:func:`scoped_key` of each key, checked in one search of their joined text (the separator
    is one character, so joining makes none): a batch names one per key."""
    if KEY_SEPARATOR in "".join(keys):
        raise InvalidParams("a key may not contain NUL (it separates a tenant from its keys)")
    if tenant == DEFAULT_TENANT:
        return keys
    prefix = f"{tenant}{KEY_SEPARATOR}"
    return [prefix + key for key in keys]


def split_key(scoped: str) -> tuple[str, str]:
    """(tenant, key) of a scoped key."""
    tenant, separator, key = scoped.partition(KEY_SEPARATOR)
    return (tenant, key) if separator else (DEFAULT_TENANT, scoped)


def local_key(scoped: str) -> str:
    """The key a tenant's client named: ``split_key(scoped)[1]``, built without the pair."""
    return scoped.partition(KEY_SEPARATOR)[2] if KEY_SEPARATOR in scoped else scoped


def tenant_of(scoped: str) -> str:
    return scoped.partition(KEY_SEPARATOR)[0] if KEY_SEPARATOR in scoped else DEFAULT_TENANT


def shown(scoped: str) -> str:
    """A scoped key as messages name it: ``'k'``, or ``'k' of tenant 't'``."""
    tenant, key = split_key(scoped)
    return repr(key) if tenant == DEFAULT_TENANT else f"{key!r} of tenant {tenant!r}"


def parse_quotas(text: str) -> dict[str, int]:
    """``"a=1GiB, b=512MB"`` as {"a": 2**30, "b": 2**29}; InvalidParams for anything else."""
    quotas: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, size = item.partition("=")
        try:
            if not equals:
                raise ValueError(item)
            quotas[check_tenant(name.strip())] = parse_size(size.strip())
        except ValueError:
            raise InvalidParams(f"tenant_quotas: {item!r} is not NAME=SIZE (SIZE such as 512MB; "
                                "0 is unlimited)") from None
    return quotas


class TenantLedger:
    """Bytes charged per tenant, and each tenant's quota (0: unlimited)."""

    def __init__(self, quotas: dict[str, int], default_quota: int) -> None:
        self.quotas = dict(quotas)  # set explicitly (settings or at run time)
        self.default_quota = default_quota
        self.used: dict[str, int] = {}

    def quota(self, tenant: str) -> int:
        return self.quotas.get(tenant, self.default_quota)

    def set_quota(self, tenant: str, quota: int) -> None:
        if isinstance(quota, bool) or not isinstance(quota, int) or quota < 0:
            raise InvalidParams(f"a quota is a byte count >= 0 (0: unlimited), got {quota!r}")
        self.quotas[check_tenant(tenant)] = quota

    def room(self, tenant: str) -> int | None:
        """Bytes ``tenant`` may still take (negative when over its quota); None: unlimited."""
        quota = self.quota(tenant)
        return None if quota == 0 else quota - self.used.get(tenant, 0)

    def excess(self, tenant: str) -> int:
        """Bytes ``tenant`` holds beyond its quota (after its quota was lowered), else 0."""
        room = self.room(tenant)
        return 0 if room is None else max(0, -room)

    def charge(self, tenant: str, num_bytes: int) -> None:
        self.used[tenant] = self.used.get(tenant, 0) + num_bytes

    def release(self, tenant: str, num_bytes: int) -> None:
        left = self.used.get(tenant, 0) - num_bytes
        if left:
            self.used[tenant] = left
        else:
            self.used.pop(tenant, None)  # a tenant that holds nothing is forgotten
