import numpy as np
import pytest

from towerps.ps import Shard, create_server, make_optimizer
from towerps.workers.client import PSClient


@pytest.fixture
def serve():
    """serve(shards) -> client: start a real gRPC server per shard on port 0."""
    servers, clients = [], []

    def start(shards, placement):
        addresses = []
        for shard in shards:
            server, port = create_server(shard, "127.0.0.1:0")
            servers.append((server, shard))
            addresses.append(f"127.0.0.1:{port}")
        client = PSClient(addresses, placement, max_attempts=2, backoff_s=0.01)
        clients.append(client)
        return client

    yield start
    for client in clients:
        client.close()
    for server, shard in servers:
        shard.close()
        server.stop(grace=None).wait()


def sgd_shard(index, variables, num_workers=1, lr=0.1):
    return Shard(index, variables, make_optimizer("sgd", lr), num_workers)


def random_variables(names_shapes, seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in names_shapes.items()}
