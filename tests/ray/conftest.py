import pytest
import ray


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster shared by a test module (4 logical CPUs: two
    workers and two shards fit at once)."""
    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "2"}})
    yield
    ray.shutdown()
