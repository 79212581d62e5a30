"""Credentials and mutual TLS on a live shard; the standard gRPC services
behind the same door, through their own Python clients."""

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from towerps.auth import (
    Credentials, ShardCredentials, bearer, driver_token, new_job_secret, observer_token,
    worker_token,
)
from towerps.codec import push_stream
from towerps.errors import AccessDenied, ConfigError, ShardUnavailable
from towerps.proto import towerps_pb2 as pb
from towerps.proto import towerps_pb2_grpc as pb_grpc
from towerps.ps import Shard, create_server, make_optimizer, plan_placement
from towerps.ps.shard import PushOutcome
from towerps.tls import TLS_OPTIONS, channel_credentials, make_job_tls
from towerps.workers.client import PSClient

pytestmark = pytest.mark.rpc

SERVICE = "towerps.v1.ParameterServer"


@pytest.fixture(scope="module")
def job_tls():
    return make_job_tls()


@pytest.fixture
def secured():
    """start(tls) -> (shard, address, secret): a shard that checks credentials."""
    started = []

    def start(tls=None, num_workers=2):
        secret = new_job_secret()
        shard = Shard(0, {"w": np.zeros(4, np.float32)}, make_optimizer("sgd", 1.0), num_workers)
        server, port = create_server(shard, "127.0.0.1:0",
                                     credentials=ShardCredentials(secret, tls,
                                                                  num_workers=num_workers))
        started.append((shard, server))
        return shard, f"127.0.0.1:{port}", secret

    yield start
    for shard, server in started:
        shard.close()
        server.stop(grace=None).wait()


def client(address, credentials=None):
    return PSClient([address], plan_placement({"w": (4,)}, 1), credentials=credentials,
                    max_attempts=1)


def raw_push(channel, rank, metadata):
    header = pb.PushHeader(worker_rank=rank, step=0, num_examples=1, num_tensors=1)
    call = channel.stream_unary(f"/{SERVICE}/Push", response_deserializer=pb.PushReply.FromString)
    return call(push_stream(header, {"w": np.ones(4, np.float32)}), timeout=10, metadata=metadata)


def test_calls_without_valid_credentials_are_refused_and_change_nothing(secured):
    shard, address, secret = secured()
    channel = grpc.insecure_channel(address)
    stub = pb_grpc.ParameterServerStub(channel)
    beyond = bearer(worker_token(secret, 2))  # the job has workers 0 and 1
    for metadata in (None, bearer(new_job_secret()), bearer(worker_token(new_job_secret(), 0)),
                     bearer(secret), beyond):
        for call in (lambda: stub.Status(pb.StatusRequest(), timeout=10, metadata=metadata),
                     lambda: list(stub.Pull(pb.PullRequest(), timeout=10, metadata=metadata)),
                     lambda: raw_push(channel, 0, metadata)):
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    _, stats = shard.stats()
    assert (shard.version, stats.pushes_applied, stats.pushes_rejected) == (0, 0, 0)
    channel.close()


def test_a_worker_may_push_as_its_own_rank_only(secured):
    shard, address, secret = secured()
    channel = grpc.insecure_channel(address)
    for token, rank in ((worker_token(secret, 1), 0), (driver_token(secret), 0),
                        (observer_token(secret), 0)):
        with pytest.raises(grpc.RpcError) as err:
            raw_push(channel, rank, bearer(token))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert shard.version == 0 and shard.stats()[1].pushes_applied == 0
    with client(address, Credentials(worker_token(secret, 1))) as worker_1:
        with pytest.raises(AccessDenied, match="worker 1 may not push as worker 0"):
            worker_1.push(0, 0, {"w": np.ones(4, np.float32)}, 1, 0.0)
        assert worker_1.push(1, 0, {"w": np.ones(4, np.float32)}, 1, 0.0) == [PushOutcome.BUFFERED]
    with client(address, Credentials(worker_token(secret, 0))) as worker_0:
        assert worker_0.push(0, 0, {"w": np.ones(4, np.float32)}, 1, 0.0) == [PushOutcome.APPLIED]
    with client(address, Credentials(driver_token(secret))) as driver:
        version, params = driver.pull(1, timeout_s=10)
    assert version == 1
    np.testing.assert_array_equal(params["w"], -np.ones(4))
    channel.close()


def test_status_counts_the_calls_refused_by_reason(secured):
    """What `towerps status` shows of an attack: each refusal counted once,
    under its reason, and read with the observer's token."""
    _, address, secret = secured()
    channel = grpc.insecure_channel(address)
    stub = pb_grpc.ParameterServerStub(channel)
    worker_0 = bearer(worker_token(secret, 0))
    refused = []
    for call in (
            lambda: stub.Status(pb.StatusRequest(), timeout=10),  # no token
            lambda: list(stub.Pull(pb.PullRequest(), timeout=10, metadata=bearer(secret))),
            lambda: raw_push(channel, 1, worker_0),  # as another rank
            lambda: list(stub.Pull(pb.PullRequest(timeout_s=-1.0), timeout=10,
                                   metadata=worker_0))):  # a negative timeout: malformed
        with pytest.raises(grpc.RpcError) as err:
            call()
        refused.append(err.value.code())
    assert refused == [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED,
                       grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT]
    reply = stub.Status(pb.StatusRequest(), timeout=10, metadata=bearer(observer_token(secret)))
    assert (reply.refused_unauthenticated, reply.refused_permission_denied,
            reply.refused_overloaded, reply.refused_bad_tensor) == (2, 1, 0, 1)
    channel.close()


def test_an_observer_reads_status_and_nothing_else(secured):
    shard, address, secret = secured()
    channel = grpc.insecure_channel(address)
    stub = pb_grpc.ParameterServerStub(channel)
    observer = bearer(observer_token(secret))
    assert stub.Status(pb.StatusRequest(), timeout=10, metadata=observer).version == 0
    shared_pull = channel.unary_unary(f"/{SERVICE}/SharedPull")
    for call in (lambda: list(stub.Pull(pb.PullRequest(), timeout=10, metadata=observer)),
                 lambda: raw_push(channel, 0, observer),
                 lambda: shared_pull(pb.PullRequest().SerializeToString(), timeout=10,
                                     metadata=observer)):
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "observer credential may not call" in err.value.details()
    assert shard.version == 0 and shard.stats()[1].pushes_applied == 0
    # The driver's token pulls, but does not push.
    driver = bearer(driver_token(secret))
    assert list(stub.Pull(pb.PullRequest(), timeout=10, metadata=driver))
    with pytest.raises(grpc.RpcError) as err:
        raw_push(channel, 0, driver)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    channel.close()


def test_a_shard_on_a_network_address_refuses_to_start_without_credentials():
    shard = Shard(0, {"w": np.zeros(1, np.float32)}, make_optimizer("sgd", 0.1), 1)
    with pytest.raises(ConfigError, match="without credentials"):
        create_server(shard, "0.0.0.0:0")


def test_mutual_tls_with_the_job_ca(secured, job_tls):
    shard, address, secret = secured(tls=job_tls)
    with client(address, Credentials(worker_token(secret, 0), job_tls)) as worker:
        assert worker.push(0, 0, {"w": np.ones(4, np.float32)}, 1, 0.0) == [PushOutcome.BUFFERED]
    # A certificate of another CA, or no TLS at all: no connection.
    with client(address, Credentials(worker_token(secret, 0), make_job_tls())) as stranger:
        with pytest.raises(ShardUnavailable):
            stranger.pull(0, timeout_s=5)
    with client(address, Credentials(worker_token(secret, 0))) as plaintext:
        with pytest.raises(ShardUnavailable):
            plaintext.pull(0, timeout_s=5)


def test_a_client_without_a_certificate_is_refused(secured, job_tls):
    _, address, secret = secured(tls=job_tls)
    server_only = grpc.ssl_channel_credentials(root_certificates=job_tls.ca_pem)
    channel = grpc.secure_channel(address, server_only, options=TLS_OPTIONS)
    with pytest.raises(grpc.RpcError) as err:
        pb_grpc.ParameterServerStub(channel).Status(pb.StatusRequest(), timeout=10,
                                                    metadata=bearer(observer_token(secret)))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    channel.close()


def test_health_and_reflection_answer_standard_clients_behind_the_same_door(secured, job_tls):
    _, address, secret = secured(tls=job_tls)
    # The standard way to send a bearer token: call credentials on a TLS
    # channel. A tool's observer token is enough for both services.
    both = grpc.composite_channel_credentials(
        channel_credentials(job_tls), grpc.access_token_call_credentials(observer_token(secret)))
    channel = grpc.secure_channel(address, both, options=TLS_OPTIONS)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    database = ProtoReflectionDescriptorDatabase(channel)
    assert SERVICE in database.get_services()
    methods = {m.name for m in database.FindFileContainingSymbol(SERVICE).service[0].method}
    assert methods == {"Push", "Pull", "PushPull", "SharedPush", "SharedPull", "SharedPushPull",
                       "Status"}
    channel.close()

    no_token = grpc.secure_channel(address, channel_credentials(job_tls), options=TLS_OPTIONS)
    with pytest.raises(grpc.RpcError) as err:
        health_pb2_grpc.HealthStub(no_token).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as err:
        ProtoReflectionDescriptorDatabase(no_token).get_services()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    no_token.close()
