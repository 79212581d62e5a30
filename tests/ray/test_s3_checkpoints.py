"""Checkpoints in S3-compatible storage, for real: moto's S3 server on
127.0.0.1, explicit credentials in the environment (as the AWS SDK under
pyarrow reads them, on the driver and in every actor), the cloud metadata
lookup off and the endpoint in the URI, so nothing reaches another address.

A run writes complete checkpoints into the bucket; with the last one made
incomplete (its manifest deleted, as if the driver had died before it),
`--resume` restores every shard from the bucket and ends bit for bit as the
uninterrupted run.
"""

import pytest
from pyarrow.fs import FileSystem

from tests.ray.conftest import S3_ENV
from tests.ray.test_checkpoints import job, weights_of
from towerps.cluster import train
from towerps.cluster.run.driver import resume_config
from towerps.ps.checkpoint import MANIFEST, CheckpointStore

pytestmark = [pytest.mark.ray, pytest.mark.slow]

BUCKET = "towerps-test"


@pytest.fixture(scope="module")
def s3_prefix(ray_cluster):
    """The URI of an empty prefix in a bucket of a local S3 server. The
    shared Ray cluster's actors hold its credentials (tests/ray/conftest.py);
    this process gets them for the module."""
    from moto.server import ThreadedMotoServer
    from pyarrow import fs

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        with pytest.MonkeyPatch.context() as env:
            for name, value in S3_ENV.items():
                env.setenv(name, value)
            fs.S3FileSystem(endpoint_override=f"{host}:{port}", scheme="http",
                            region="us-east-1", allow_bucket_creation=True).create_dir(BUCKET)
            yield (f"s3://{BUCKET}/runs?endpoint_override={host}:{port}&scheme=http"
                   "&region=us-east-1")
    finally:
        server.stop()


def test_checkpoints_in_s3_are_complete_and_a_run_resumes_from_them_bit_for_bit(
        s3_prefix, tmp_path):
    run_dir = tmp_path / "run"
    first = train(job(run_dir, steps=8, checkpoint_dir=s3_prefix), progress=False)
    assert first.checkpoints.complete == [4, 8] and not first.checkpoints.errors
    assert first.checkpoints.uri == s3_prefix
    store = CheckpointStore(s3_prefix)
    assert store.complete() == [4, 8]
    final = weights_of(run_dir / "model.keras")
    assert not (run_dir / "checkpoints").exists()  # the shards wrote to the bucket

    # As if the driver had died before checkpoint 8 was complete.
    bucket, _ = FileSystem.from_uri(s3_prefix)
    bucket.delete_file(f"{store.folder(8)}/{MANIFEST}")
    assert store.latest() == 4
    resumed = train(resume_config(str(run_dir)), resume=True, progress=False)
    assert resumed.checkpoints.resumed_from == 4 and resumed.steps == 8
    assert store.complete() == [4, 8]
    assert weights_of(run_dir / "model.keras") == final
