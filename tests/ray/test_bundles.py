"""A replacement asked into a placement bundle that no live node holds.

When Ray declares a node dead, the bundles it held wait to be placed again,
and on a cluster whose other nodes are full they wait for ever; so may an
actor asked into one just before (Ray fails it only sometimes).
`get_in_bundle` is what keeps a recovery from waiting for ever: here on a
real placement group whose bundle cannot be placed (it asks for more CPUs
than the cluster has), the state a lost node's bundle is in.
"""

import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group

from towerps.cluster.run.job import get_in_bundle
from towerps.cluster.run.reservation import Reservation, plan_layout
from towerps.errors import ActorDied

pytestmark = pytest.mark.ray


@ray.remote(num_cpus=0)
class Echo:
    def echo(self, x):
        return x


@pytest.fixture
def reserve(ray_cluster):
    """A Reservation of one worker's bundle asking for `cpus`, `placed` or never."""
    made = []

    def make(cpus: float, placed: bool) -> Reservation:
        layout = plan_layout(1, 0, {"CPU": cpus}, num_nodes=1)
        made.append(placement_group(list(layout.bundles), strategy=layout.strategy))
        assert made[-1].wait(timeout_seconds=60 if placed else 0) == placed
        return Reservation(layout, made[-1], {})

    yield make
    for group in made:
        remove_placement_group(group)


def test_an_actor_in_an_unplaced_bundle_is_killed_and_reported_dead(reserve):
    reservation = reserve(64, placed=False)  # the cluster has 4 CPUs
    assert reservation.bundle_lost(0)
    actor = Echo.options(**reservation.bundle_options(0)).remote()
    with pytest.raises(ActorDied, match="shard 1's replacement: its placement bundle's node"):
        get_in_bundle(actor.echo.remote(7), actor, reservation, 0, "shard 1's replacement")
    with pytest.raises(ray.exceptions.RayActorError):  # killed: not left waiting
        ray.get(actor.echo.remote(8), timeout=60)


def test_an_actor_in_a_placed_bundle_answers(reserve):
    reservation = reserve(1, placed=True)
    assert not reservation.bundle_lost(0)
    actor = Echo.options(**reservation.bundle_options(0)).remote()
    assert get_in_bundle(actor.echo.remote(7), actor, reservation, 0, "worker 0") == 7
