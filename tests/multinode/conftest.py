"""One Ray cluster of three nodes on this machine per test file (``ray.cluster_utils.Cluster``;
the tier has one file).

Each node offers one custom resource that names its role, so where an actor runs is decided by
the config, not by Ray's load balancing: the head node (1 CPU, ``learner_node``) takes the
learner; two rollout nodes (1 CPU, 1 ``rollout_node`` each) take one EnvRunner each. A test may
add a node; the cluster is torn down after the file's last test, so the tiers after this one find no Ray
running. A Ray still running in this pytest process (the integration tier's session-scoped one)
is shut down before the cluster starts.
"""

import shutil
import tempfile
from pathlib import Path

import pytest
import ray
import ray._common.utils
from ray.cluster_utils import Cluster

OBJECT_STORE_BYTES = 100 * 1024**2  # per node: the tiny policy's weights are under 1 MB
ROLLOUT_NODE = {"num_cpus": 1, "resources": {"rollout_node": 1}, "object_store_memory": OBJECT_STORE_BYTES}


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    temp_dir = tempfile.mkdtemp(prefix="ray-")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": {"learner_node": 1},
            "object_store_memory": OBJECT_STORE_BYTES,
            "include_dashboard": False,
            # short: Ray's sockets live under it and a Unix socket's path has at most 107 bytes
            # (pytest-xdist's worker folders, popen-gwN/, would push it over)
            "temp_dir": temp_dir,
            # a node that stops answering is declared dead after about 3 s, not 30
            "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3},
        },
    )
    for _ in range(2):
        cluster.add_node(**ROLLOUT_NODE)
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()
    # the head node wrote its address to /tmp/ray/ray_current_cluster, where a later ray.init()
    # without an address would look for a cluster; it is gone now
    address_file = Path(ray._common.utils.get_ray_address_file(None))
    if address_file.is_file() and address_file.read_text().strip() == cluster.gcs_address:
        address_file.unlink()
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def spare_rollout_node(cluster):
    """One more rollout node, for an EnvRunner that lost its own."""
    return cluster.add_node(**ROLLOUT_NODE)


@pytest.fixture
def placed_config(cluster, small_config):
    """``small_config`` with one remote learner on the head node and two EnvRunners, each on a
    rollout node: RLlib's custom resources per learner and per EnvRunner name the nodes."""
    return small_config.env_runners(
        num_env_runners=2, num_cpus_per_env_runner=1, custom_resources_per_env_runner={"rollout_node": 1}
    ).learners(num_learners=1, num_cpus_per_learner=1, custom_resources_per_learner={"learner_node": 1})
