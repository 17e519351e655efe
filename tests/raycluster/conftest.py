"""A Ray cluster of two nodes on loopback for the ``ray`` tests.

Ray's own test utility (``ray.cluster_utils.Cluster``) starts a head and a second node on this
machine, one CPU each (the machine is small and shared); the fixture joins it, yields its
address and shuts it down after the module. Tests skip with a reason when Ray is missing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# Loopback only: Ray would otherwise swap 127.0.0.1 for this machine's outward address (read
# when ray is first imported, so before any test module imports it); no token for a test
# cluster that only loopback reaches.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

RAY_REASON = "needs the ray extra: pip install 'vflink[ray]' (the `ray` CI job installs it)"


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    ray = pytest.importorskip("ray", reason=RAY_REASON)
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "include_dashboard": False, "node_ip_address": "127.0.0.1"}
    # A node's start can time out on a small, busy machine (a full local run once failed here
    # with "Exception: The cur...", as Ray's start-up timeout begins): start the cluster
    # afresh once more before the tests that need it fail on it.
    for attempt in (1, 2):
        cluster = None
        try:
            cluster = Cluster(initialize_head=True, head_node_args=node)
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
            ray.init(address=cluster.address, log_to_driver=False)
            cluster.wait_for_nodes()
            break
        except Exception:
            ray.shutdown()
            if cluster is not None:
                cluster.shutdown()
            if attempt == 2:
                raise
    try:
        yield cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()
