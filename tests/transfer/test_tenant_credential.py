"""A tenant credential's text form: what `mooncake tenant credential` prints parses back whole."""

from __future__ import annotations

import pytest

from transfer.auth import ClusterSecret, TenantCredential
from transfer.errors import SettingError

SECRET = ClusterSecret("a-cluster-secret-for-credentials")


@pytest.mark.parametrize("tenant", ["acme", "a:b:c", "x" * 128])
def test_a_credential_parses_back_to_the_same_tenant_and_keys(tenant):
    issued = SECRET.tenant_credential(tenant)
    parsed = TenantCredential.parse(issued.text + "\n")  # as a shell captures it
    assert parsed.tenant == tenant and parsed.text == issued.text
    assert parsed.curve_public_key == issued.curve_public_key != SECRET.curve_public_key
    assert parsed.server_public_key == SECRET.curve_public_key
    assert parsed.proof(b"p", b"nonce") == SECRET.tenant_credential(tenant).proof(b"p", b"nonce")
    assert ClusterSecret("another-cluster-secret!").tenant_credential(tenant).text != issued.text


@pytest.mark.parametrize("text", ["", "mooncake-tenant-1:", SECRET.tenant_credential("t").text[:-2],
                                  SECRET.tenant_credential("t").text.replace("mooncake-tenant-1", "x")])
def test_anything_else_is_a_setting_error_that_never_quotes_it(text):
    with pytest.raises(SettingError, match="tenant_credential") as refused:
        TenantCredential.parse(text)
    assert "(hidden)" in str(refused.value)
