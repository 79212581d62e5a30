"""A shard actor's `stop` ends its gRPC server and lets go of it and of the
shard (and through it the checkpoint store's actor handle), so none is
deleted later, while Ray ends the process (where its
`__del__` would print "Exception ignored ..." and a SystemExit traceback
to the user's terminal). The actor's class is used as plain Python here:
no Ray, a real server on port 0."""

import gc
import socket
import weakref

import numpy as np
import pytest

from towerps.cluster.run.actors import ShardActor
from towerps.ps import Shard, create_server, make_optimizer

from tests.polling import wait_until

pytestmark = pytest.mark.rpc


def refuses(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_stop_ends_the_server_and_frees_it_before_the_process_ends():
    actor = ShardActor.__ray_metadata__.modified_class(0)
    shard = Shard(0, {"w": np.zeros((4,), np.float32)}, make_optimizer("sgd", 0.1), 1)
    server, port = create_server(shard, "127.0.0.1:0")
    actor._shard, actor._server = shard, server  # what ShardActor.start sets up
    alive, shard_alive = weakref.ref(server), weakref.ref(shard)
    del server, shard
    gc.collect()
    assert alive() is not None and shard_alive() is not None and not refuses(port)

    actor.stop()
    assert alive() is None  # the server deleted inside stop, not at exit
    # The shard too, once gRPC's serving thread, which holds the handlers
    # (and through them the shard) in its frame, has returned: stop's wait
    # ends when that thread signals shutdown, a moment before it returns.
    wait_until(lambda: gc.collect() is not None and shard_alive() is None, timeout_s=10,
               what="the shard freed after stop")
    assert refuses(port)
    actor.stop()  # idempotent
