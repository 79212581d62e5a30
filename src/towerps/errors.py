"""The errors towerps raises on purpose.

Every error derives from `TowerpsError`, keeps its message as its only
constructor argument (so it pickles across Ray actors unchanged) and says
what is wrong and how to fix it. Servicers map them to gRPC status codes.
"""


class TowerpsError(Exception):
    """Base class of every error towerps raises on purpose."""


class ConfigError(TowerpsError, ValueError):
    """A flag or config value is invalid; the message names it and the fix."""


class DataSetNotFound(TowerpsError, FileNotFoundError):
    """A data set is neither on disk nor downloadable from here."""


class BadRequest(TowerpsError, ValueError):
    """A request is malformed or a field is out of range (INVALID_ARGUMENT)."""


class BadTensor(BadRequest):
    """A tensor's name, dtype, shape or bytes do not match what was expected."""


class NotFinite(BadTensor):
    """A gradient holds NaN or infinity, or values so large that summing or
    applying it would overflow; the message names the tensor and the policy."""


class StepMismatch(TowerpsError):
    """A push names a step the shard cannot accept (ahead of its version)."""


class PullTimeout(TowerpsError, TimeoutError):
    """A pull waited past its deadline for a version that did not appear."""


class ShardUnavailable(TowerpsError, ConnectionError):
    """A shard did not answer (dead peer, wrong address, network)."""


class AccessDenied(TowerpsError, PermissionError):
    """A call carried no valid credentials, or credentials for another worker rank."""


class NotAuthenticated(AccessDenied):
    """A call carried no valid credentials at all (UNAUTHENTICATED)."""


class Overloaded(TowerpsError):
    """A shard refused a call beyond its concurrency caps (RESOURCE_EXHAUSTED)."""


class ClusterError(TowerpsError, RuntimeError):
    """Ray could not be reached or could not place what a job asks for."""


class ActorDied(ClusterError):
    """A job's actor is gone: its process died or its node was lost."""


class ActorFailed(ClusterError):
    """Code in a job's actor raised an error that is not towerps' own."""


class RecoveryFailed(ClusterError):
    """An actor or a node died during training and the job could not go on
    (no complete checkpoint to start from, or no way to hand a lost node's
    rows to the others): a runtime failure (exit 1), not bad input."""


class CheckpointError(TowerpsError):
    """A checkpoint is missing, incomplete, or not one towerps wrote."""
