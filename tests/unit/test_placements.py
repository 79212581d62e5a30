"""The job's placements (cluster/run/placements.py), without Ray: one typed
record per actor, placement.json rewritten with the same keys on every
change, and the questions a node loss asks of them."""

import json

import pytest

from towerps.cluster.run.placements import (PLACEMENT_FILE, Placement, Placements,
                                            read_placement)
from towerps.errors import ClusterError

pytestmark = pytest.mark.unit


def shard(k: int, node: str, pid: int) -> dict:
    """ShardActor.start's answer, as the job puts it."""
    return {"role": "ps", "index": k, "node_ip": f"10.0.0.{node}", "node_id": f"node-{node}",
            "hostname": f"host-{node}", "pid": pid, "code": "/srv/towerps",
            "address": f"10.0.0.{node}:{5000 + k}", "parameter_bytes": 1024, "version": 0,
            "bundle": k}


def worker(rank: int, node: str, pid: int) -> dict:
    """WorkerActor.setup's answer, as the job puts it."""
    return {"role": "worker", "index": rank, "node_ip": f"10.0.0.{node}",
            "node_id": f"node-{node}", "hostname": f"host-{node}", "pid": pid,
            "code": "/srv/towerps", "devices": ["/CPU:0"], "intra_op_threads": 0,
            "inter_op_threads": 0, "ray_gpu_ids": [], "same_node_shards": [rank],
            "segment_prefix": "tps-run", "bundle": 2 + rank}


def two_nodes(path=None) -> Placements:
    placements = Placements(path)
    placements.put(*map(Placement.reported, [shard(0, "a", 10), shard(1, "b", 11),
                                             worker(0, "a", 20), worker(1, "b", 21)]))
    return placements


def test_placement_json_holds_every_key_each_actor_reported(tmp_path):
    path = str(tmp_path / PLACEMENT_FILE)
    two_nodes(path)
    on_disk = json.loads((tmp_path / PLACEMENT_FILE).read_text())
    assert on_disk == [shard(0, "a", 10), shard(1, "b", 11), worker(0, "a", 20),
                       worker(1, "b", 21)]
    assert read_placement(str(tmp_path)) == on_disk
    assert read_placement(str(tmp_path / "elsewhere")) == []


def test_a_replacement_takes_its_predecessors_place_and_the_file_says_so(tmp_path):
    placements = two_nodes(str(tmp_path / PLACEMENT_FILE))
    spare = {**worker(1, "a", 30), "spare": 0}  # a spare on node a took rank 1
    placements.put(Placement.reported(spare))
    assert placements.worker(1).pid == 30 and placements.worker(1).spare == 0
    on_disk = read_placement(str(tmp_path))
    assert [(r["role"], r["index"]) for r in on_disk] == [("ps", 0), ("ps", 1), ("worker", 0),
                                                         ("worker", 1)]
    assert on_disk[-1] == spare
    placements.remove("worker", 1)
    assert placements.worker(1) is None and len(read_placement(str(tmp_path))) == 3


def test_a_worker_lost_with_its_node_is_kept_marked_and_redirects_update_its_shards(tmp_path):
    placements = two_nodes(str(tmp_path / PLACEMENT_FILE))
    placements.mark_lost([1])
    placements.set_same_node_shards({0: [0, 1], 7: [0]})  # 7: no such worker, ignored
    on_disk = {(r["role"], r["index"]): r for r in read_placement(str(tmp_path))}
    assert on_disk["worker", 1]["lost"] is True and "lost" not in on_disk["worker", 0]
    assert on_disk["worker", 0]["same_node_shards"] == [0, 1]
    assert placements.lost_ranks() == {1}


def test_the_nodes_a_loss_takes_and_where_its_shards_start_again():
    placements = two_nodes()
    assert placements.shard_nodes(2) == ["node-a", "node-b"]
    assert placements.nodes_not_in({"node-a", "node-b"}) == {}
    assert placements.nodes_not_in({"node-a"}) == {"node-b": "10.0.0.b"}
    assert placements.on_nodes({"node-b"}) == ([1], [1])
    assert placements.fewest_shards({"node-a"}) == "node-a"
    # A node with workers only holds no shard: the lost node's shard goes there.
    placements.put(Placement.reported(worker(2, "c", 40)))
    assert placements.fewest_shards({"node-a", "node-c"}) == "node-c"
    with pytest.raises(ClusterError, match="every node this job ran on was lost"):
        placements.fewest_shards({"node-z"})


def test_a_record_read_back_from_placement_json_is_the_same_record():
    for record in (shard(1, "b", 11), {**worker(0, "a", 20), "lost": True},
                   {"role": "spare", "index": 0, "node_ip": "10.0.0.a", "node_id": "node-a",
                    "pid": 50, "bundle": 4}):
        assert Placement.reported(record).to_json() == record


def test_workers_json_names_the_process_that_holds_a_rank_now(tmp_path):
    from towerps.cluster.observe.observers import WorkersFile, read_workers_file
    from towerps.workers.worker import WorkerReport

    placements = two_nodes()
    figures = WorkersFile(str(tmp_path), placements)
    figures.workers(4, [WorkerReport(rank=1, steps=4, at_s=1.0)])
    assert read_workers_file(str(tmp_path))["workers"][0]["pid"] == 21
    placements.put(Placement.reported(worker(1, "a", 31)))  # its replacement
    figures.workers(8, [WorkerReport(rank=1, steps=2, at_s=2.0)])
    row = read_workers_file(str(tmp_path))["workers"][0]
    assert (row["pid"], row["node_ip"]) == (31, "10.0.0.a")
