"""Which bundle each shard and worker goes into, and the errors for nodes that
cannot hold them (cluster/run/reservation.py; no Ray)."""

import pytest

from towerps.cluster.run.reservation import Node, check_fits, describe, plan_layout
from towerps.errors import ClusterError

pytestmark = pytest.mark.unit

CPU = {"CPU": 1.0}
GPU_WORKER = {"CPU": 1.0, "GPU": 1.0}


def nodes(*resources):
    return [Node(f"10.0.0.{i + 1}", f"id{i}", r) for i, r in enumerate(resources)]


def test_one_shard_and_one_worker_per_node_strictly_spread():
    layout = plan_layout(num_workers=2, num_ps=2, worker_resources=CPU, num_nodes=2)
    assert layout.strategy == "STRICT_SPREAD"
    assert layout.bundles == ({"CPU": 2.0}, {"CPU": 2.0})
    assert layout.shard_bundle == (0, 1) and layout.worker_bundle == (0, 1)


def test_each_spare_worker_gets_a_bundle_of_its_own_after_the_slots():
    layout = plan_layout(2, 2, GPU_WORKER, num_nodes=4, spare_workers=2)
    assert layout.strategy == "STRICT_SPREAD"  # 4 bundles on 4 nodes
    assert layout.bundles[2:] == (GPU_WORKER, GPU_WORKER) and layout.spare_bundle == (2, 3)
    assert layout.worker_bundle == (0, 1)
    assert plan_layout(2, 2, CPU, num_nodes=2, spare_workers=1).strategy == "SPREAD"


def test_a_worker_bundle_carries_the_workers_gpus():
    layout = plan_layout(2, 2, GPU_WORKER, num_nodes=4)
    assert layout.strategy == "STRICT_SPREAD"  # 2 slots on 4 nodes: still one per node
    assert layout.bundles == ({"CPU": 2.0, "GPU": 1.0},) * 2


@pytest.mark.parametrize(
    "workers, shards, expected",
    [
        (3, 1, ({"CPU": 2.0}, {"CPU": 1.0}, {"CPU": 1.0})),  # slots 1, 2: a worker alone
        (1, 3, ({"CPU": 2.0}, {"CPU": 1.0}, {"CPU": 1.0})),  # slots 1, 2: a shard alone
    ],
)
def test_counts_that_differ_fill_the_extra_slots_with_what_is_left(workers, shards, expected):
    layout = plan_layout(workers, shards, CPU, num_nodes=3)
    assert layout.bundles == expected
    assert len(layout.worker_bundle) == workers and len(layout.shard_bundle) == shards


def test_more_slots_than_nodes_fall_back_to_spread():
    layout = plan_layout(2, 2, CPU, num_nodes=1)  # local mode: one node
    assert layout.strategy == "SPREAD"
    check_fits(layout, nodes({"CPU": 4.0}))


def test_a_node_without_the_gpu_is_named_with_what_it_lacks():
    layout = plan_layout(2, 2, GPU_WORKER, num_nodes=2)
    with pytest.raises(ClusterError) as err:
        check_fits(layout, nodes({"CPU": 4.0, "GPU": 1.0}, {"CPU": 4.0}))
    message = str(err.value)
    assert "node 10.0.0.2 lacks GPU 1" in message
    assert "10.0.0.1" not in message  # the node that can hold it is not blamed
    assert "each node needs CPU 2, GPU 1" in message


def test_a_small_node_is_named_with_the_cpus_it_lacks():
    layout = plan_layout(2, 2, CPU, num_nodes=2)
    with pytest.raises(ClusterError, match=r"node 10.0.0.2 lacks CPU 1 \(has CPU 1\)"):
        check_fits(layout, nodes({"CPU": 2.0}, {"CPU": 1.0}))


def test_strict_spread_finds_an_assignment_where_first_fit_would_not():
    # Slot 0 (shard + worker, GPU) fits only node 1; slot 1 (a lone shard) fits
    # both. Placing slot 1 first on node 1 would block slot 0: the matching
    # moves it.
    layout = plan_layout(1, 2, GPU_WORKER, num_nodes=2)
    check_fits(layout, nodes({"CPU": 1.0}, {"CPU": 2.0, "GPU": 1.0}))


def test_a_cpu_only_head_is_skipped_when_the_gpu_nodes_suffice():
    layout = plan_layout(2, 2, GPU_WORKER, num_nodes=3)
    check_fits(layout, nodes({"CPU": 8.0}, {"CPU": 8.0, "GPU": 4.0}, {"CPU": 8.0, "GPU": 4.0}))


def test_spread_reports_the_cluster_wide_shortfall():
    layout = plan_layout(4, 4, CPU, num_nodes=2)
    with pytest.raises(ClusterError, match=r"needs CPU 8 in all but has CPU 6 \(short of CPU 2\)"):
        check_fits(layout, nodes({"CPU": 3.0}, {"CPU": 3.0}))


def test_spread_reports_a_bundle_no_node_can_hold():
    # Enough CPUs and GPUs in all, but never on the same node.
    layout = plan_layout(3, 3, GPU_WORKER, num_nodes=2)
    with pytest.raises(ClusterError, match="no node of the Ray cluster can hold CPU 2, GPU 1"):
        check_fits(layout, nodes({"CPU": 8.0}, {"CPU": 1.0, "GPU": 4.0}))


def test_placement_lines_name_node_bundle_and_address_or_devices():
    records = [
        {"role": "worker", "index": 0, "node_ip": "10.0.0.1", "bundle": 0, "devices": ["/GPU:0"]},
        {"role": "ps", "index": 0, "node_ip": "10.0.0.1", "bundle": 0, "address": "10.0.0.1:5000"},
    ]
    assert describe(records) == [
        "ps 0 on node 10.0.0.1 (bundle 0) serving gRPC at 10.0.0.1:5000",
        "worker 0 on node 10.0.0.1 (bundle 0) devices /GPU:0",
    ]
