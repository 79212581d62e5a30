"""Workers: models, data sets, towers, the PS client and the worker loop.

Public API: `load_dataset`, `build_model`, `Tower`, `PSClient`, `Worker`,
`WorkerSpec`. This package never imports Ray.
"""

from towerps.workers.client import PSClient
from towerps.workers.data import DATASETS, DataSet, load_dataset
from towerps.workers.models import DEFAULT_MODEL, MODELS, build_model, model_input_shape
from towerps.workers.tower import Tower
from towerps.workers.worker import Worker, WorkerReport, WorkerSpec

__all__ = [
    "DATASETS",
    "DEFAULT_MODEL",
    "MODELS",
    "DataSet",
    "PSClient",
    "Tower",
    "Worker",
    "WorkerReport",
    "WorkerSpec",
    "build_model",
    "load_dataset",
    "model_input_shape",
]
