import numpy as np
import pytest

from towerps.ps import Shard, create_server, make_optimizer, plan_placement
from towerps.workers.client import PSClient


@pytest.fixture
def serve():
    """serve(variables, num_shards=1, ...) -> client: place `variables` on
    real shards, each behind a real gRPC server on 127.0.0.1 port 0."""
    servers, clients = [], []

    def start(variables, num_shards=1, num_workers=1, lr=0.1, wire_dtype="float32", slice_bytes=None):
        plan = plan_placement({n: v.shape for n, v in variables.items()}, num_shards,
                              slice_bytes=slice_bytes)
        addresses = []
        for k, part in enumerate(plan.split(variables)):
            shard = Shard(k, part, make_optimizer("sgd", lr), num_workers)
            server, port = create_server(shard, "127.0.0.1:0")
            servers.append((server, shard))
            addresses.append(f"127.0.0.1:{port}")
        client = PSClient(addresses, plan, wire_dtype, max_attempts=2, backoff_s=0.01)
        clients.append(client)
        return client

    yield start
    for client in clients:
        client.close()
    for server, shard in servers:
        shard.close()
        server.stop(grace=None).wait()


def random_variables(names_shapes, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in names_shapes.items()}
