"""The names a flag may take, and the defaults that depend on them: no imports.

    from towerps.choices import DATASETS, OPTIMIZERS
    TrainConfig(dataset="cifar10")      # checked against DATASETS

The configuration (cluster/api/config.py), the command line and the
implementations check values against these, so that each list is written
once and a bad flag is refused before TensorFlow, numpy or gRPC is loaded
(a shard process, which imports none of TensorFlow, may import this too).
The implementations re-export the lists they own (`towerps.ps.modes.MODES`,
`towerps.workers.data.DATASETS`, ...); tests/unit/test_config_flags.py
checks the ones that keep their own copy (the wire and the transports).
"""

DATASETS = ("fashion_mnist", "cifar10", "synthetic")  # workers/data.py
MODELS = ("mlp", "cnn", "cifar10_cnn")  # workers/catalog.py, models.py
DEFAULT_MODEL = {"fashion_mnist": "mlp", "cifar10": "cifar10_cnn", "synthetic": "mlp"}
OPTIMIZERS = ("sgd", "momentum", "adam", "adagrad")  # ps/optimizers.py
DEFAULT_LR = {"sgd": 0.1, "momentum": 0.05, "adam": 1e-3, "adagrad": 0.01}
# How a shard applies an embedding table's row-sparse gradient (ps/tables.py)
TABLE_OPTIMIZERS = ("exact", "lazy")

MODES = ("sync", "async", "ssp")  # ps/modes.py
SUM_ORDERS = ("rank", "arrival")  # a sync step's order of addition (ps/aggregation.py)
NONFINITE = ("reject", "skip-step")  # a gradient with NaN or infinity

WIRE_DTYPES = ("float32", "bfloat16", "float16")  # src/towerps/wire.py's WIRE_DTYPES keys
TRANSPORTS = ("shm", "grpc")  # --same-node-transport (src/towerps/shm.py)
PUSH_PULL = ("combined", "separate")  # --push-pull (workers/client.py)
TLS_CHOICES = ("auto", "on", "off")  # --tls (cluster/run/security.py)
TOWER_BALANCES = ("equal", "measured")  # --tower-balance (workers/tower_group.py)
BATCH_SPLITS = ("equal", "measured")  # --batch-split (cluster/run/split.py)
