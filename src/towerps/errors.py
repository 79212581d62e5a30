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


class BadTensor(TowerpsError, ValueError):
    """A tensor's name, dtype, shape or bytes do not match what was expected."""


class StepMismatch(TowerpsError):
    """A push names a step the shard cannot accept (ahead of its version)."""


class PullTimeout(TowerpsError, TimeoutError):
    """A pull waited past its deadline for a version that did not appear."""


class ShardUnavailable(TowerpsError, ConnectionError):
    """A shard did not answer (dead peer, wrong address, network)."""


class ClusterError(TowerpsError, RuntimeError):
    """Ray could not be reached or could not place what a job asks for."""


class CheckpointError(TowerpsError):
    """A checkpoint is missing, incomplete, or not one towerps wrote."""
