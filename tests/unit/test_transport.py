"""The transport's two mappings, both ways (ps/transport.py): push outcomes
to the wire and back, and a shard's errors to status codes and back to the
error a client catches."""

import grpc
import pytest

from towerps.errors import (
    AccessDenied, BadRequest, BadTensor, NotAuthenticated, NotFinite, Overloaded, PullTimeout,
    ShardUnavailable, StepMismatch,
)
from towerps.proto import towerps_pb2 as pb
from towerps.ps.shard import PushOutcome, PushResult
from towerps.ps.transport import (
    STATUS_CODES, error_of, push_outcome, push_reply, pushed_outcome,
)

pytestmark = pytest.mark.unit


class Failed(grpc.RpcError):
    """A call that ended with `code`, as grpc raises it at a client."""

    def __init__(self, code: grpc.StatusCode, details: str = "what the shard said"):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize("outcome", list(PushOutcome))
def test_every_outcome_travels_as_the_wire_value_of_its_name_and_comes_back(outcome):
    reply = push_reply(PushResult(outcome, version=7))
    assert pb.PushReply.Outcome.Name(reply.outcome) == outcome.name
    assert reply.version == 7
    assert push_outcome(pb.PushReply.FromString(reply.SerializeToString())) is outcome


def test_an_outcome_no_shard_sends_and_a_push_pull_answer_without_one_are_bad_answers():
    with pytest.raises(BadTensor, match="outcome 0"):
        push_outcome(pb.PushReply())
    with pytest.raises(BadTensor, match="shard 3 at x:1 answered a PushPull without"):
        pushed_outcome(pb.PullHeader(version=2), "shard 3 at x:1")
    header = pb.PullHeader(version=2, push=pb.PushReply(outcome=pb.PushReply.DUPLICATE))
    assert pushed_outcome(header, "shard 3") is PushOutcome.DUPLICATE


@pytest.mark.parametrize("raised", [
    NotAuthenticated("no token"), AccessDenied("worker 1 may not push as worker 0"),
    Overloaded("cap"), BadRequest("timeout_s nan"), BadTensor("shape"), NotFinite("nan"),
    StepMismatch("step 5 at version 0"), PullTimeout("version 3 did not appear"),
    ShardUnavailable("closing"),
])
def test_a_shard_error_reaches_the_client_as_its_own_kind_through_its_status_code(raised):
    """What a caller catches is the kind the shard raised (a BadRequest
    comes back as BadTensor, the subclass a client has always caught)."""
    code = next(code for kind, code in STATUS_CODES if isinstance(raised, kind))
    caught = error_of(Failed(code, str(raised)), "shard 0 at 127.0.0.1:1")
    family = next(kind for kind, _ in STATUS_CODES if isinstance(raised, kind))
    assert isinstance(caught, family), (type(raised), code, type(caught))
    assert "shard 0 at 127.0.0.1:1" in str(caught) and str(raised) in str(caught)


def test_codes_a_shard_never_answers_with_are_an_unavailable_shard():
    for code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.CANCELLED):
        caught = error_of(Failed(code), "shard 1 at 127.0.0.1:2")
        assert type(caught) is ShardUnavailable and code.name in str(caught)


def test_every_error_class_has_one_code_and_subclasses_come_before_their_bases():
    kinds = [kind for kind, _ in STATUS_CODES]
    codes = [code for _, code in STATUS_CODES]
    assert len(set(codes)) == len(codes)
    for i, kind in enumerate(kinds):
        assert not any(issubclass(kind, earlier) for earlier in kinds[:i]), kind
