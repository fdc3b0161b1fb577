"""The P/D cluster that test_serving_cluster.py and test_openai_api.py share (a torch worker takes
seconds to start): 2 prefill + 2 decode workers, store, conductor.

It lives until the last test of this package that uses it. test_serving_cluster.py's fault tests
kill one worker of each role; whatever runs after them has one of each left, so tests on it ask
for no more than that.
"""

from __future__ import annotations

import pytest

from tests.conftest import Mooncake
from tests.daemons.serving.helpers import SERVING_ENV


@pytest.fixture(scope="package")
def pd_cluster(tmp_path_factory):
    runner = Mooncake(tmp_path_factory.mktemp("serving") / "cluster")
    runner.env.update(SERVING_ENV)
    info = runner.json("up", timeout=120)
    conductor = next(d for d in info["daemons"] if d["role"] == "conductor")
    yield runner, conductor["http_address"], info
    runner("down", timeout=60)
