"""`mooncake tenant list`, `quota NAME SIZE` and `credential NAME`: the store's tenants, their
quotas and their credentials.

A tenant is a key namespace with a memory quota (see store.tenants). The quotas the master starts
with are the tenant_quotas and default_tenant_quota settings; `quota` changes one at run time
(logged in the HA op log, store.oplog).
`credential` derives a tenant's credential from the cluster secret (transfer.auth), on this host,
without asking any daemon.
"""

from __future__ import annotations

import typer
from rich.table import Table

from mooncake_cli.options import Config, settings_options
import sys

from mooncake_cli.output import JSON_HELP, emit, fail, fail_on
from transfer.errors import MooncakeError, SettingError
from transfer.settings import SIZE_UNITS_HELP, parse_size

app = typer.Typer(help="The store's tenants: usage, quotas, and changing a quota at run time.",
                  no_args_is_help=True)


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _render(rows: list[dict]) -> Table:
    table = Table("tenant", "used", "quota", "objects", title="tenants")
    for row in rows:
        quota = _size(row["quota_bytes"]) if row["quota_bytes"] else "unlimited"
        table.add_row(row["tenant"], _size(row["used_bytes"]), quota, str(row["num_objects"]))
    return table


def _ask(config: Config, call):
    # Imported here, not at the top: every `mooncake` call imports this module to build its parser.
    from daemons.cluster.store_access import connect_master

    try:
        master = connect_master(config, "tenant-admin")
        try:
            return call(master)
        finally:
            master.close()
    except MooncakeError as exc:
        fail_on(exc)


@app.command("list")
@settings_options("cluster", "rpc", "master", "cluster_id")
def list_tenants(json_output: bool = typer.Option(False, "--json", help=JSON_HELP), *, config: Config) -> None:
    """List every tenant with a quota or an object: used memory, quota, objects.

    Used is the memory its objects hold, every replica counted; a quota of 0 (in --json) is
    unlimited."""
    emit(_ask(config, lambda master: master.inspect("tenants")), json_output, _render)


@app.command("quota")
@settings_options("cluster", "rpc", "master", "cluster_id")
def quota(
    name: str = typer.Argument(..., help="The tenant."),
    size: str = typer.Argument(..., help=f"Its new quota, 0 for unlimited. {SIZE_UNITS_HELP}"),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *,
    config: Config,
) -> None:
    """Set a tenant's quota on the running master.

    With HA (etcd) the op log keeps it for a new leader; a master without HA forgets it when it
    restarts (the settings give the quotas it starts with). A tenant
    already above its new quota loses its least recently used objects on the master's next
    eviction pass; puts past it fail with TENANT_QUOTA_EXCEEDED (code -1700)."""
    try:
        quota_bytes = parse_size(size)
    except ValueError:
        raise typer.BadParameter(f"{size!r} is not a size such as 512MB or 0") from None
    row = _ask(config, lambda master: master.set_tenant_quota(name, quota_bytes))
    emit(row, json_output, lambda r: _render([r]))


@app.command("credential")
@settings_options("cluster")
def credential(
    name: str = typer.Argument(..., help="The tenant."),
    json_output: bool = typer.Option(False, "--json", help=JSON_HELP),
    *,
    config: Config,
) -> None:
    """Print a tenant's credential, derived from the cluster secret (which this needs).

    Stdout holds the credential alone, for a script to capture. Give it to the tenant's clients
    as MOONCAKE_TENANT_CREDENTIAL (or tenant_credential in their YAML): they then reach that
    tenant's keys only, over TCP, and name their tenant by it. Anyone holding it acts for the
    tenant: keep it as secret as the cluster secret. It lasts as long as the cluster secret."""
    # Imported here, not at the top: every `mooncake` call imports this module to build its parser.
    from store.tenants import check_tenant
    from transfer.auth import cluster_secret

    try:
        tenant = check_tenant(name)
        secret = cluster_secret(config)
    except (SettingError, MooncakeError) as exc:
        fail_on(exc)
    if secret is None:
        fail("no cluster secret here (MOONCAKE_CLUSTER_SECRET, cluster_secret_file or <workdir>/secret): "
             "a tenant credential is derived from it")
    text = secret.tenant_credential(tenant).text
    if json_output:
        emit({"tenant": tenant, "credential": text}, True, str)
    else:
        # Not through rich: its markup would take the key's brackets for tags.
        sys.stdout.write(text + "\n")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="tenant")
