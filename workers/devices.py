"""Device set-up of one worker process: the TF1 `ConfigProto` knobs in TF2 terms.

    devices = configure_devices(DeviceConfig(gpus_per_worker=2, cpu_towers=1,
                                             memory_growth=True))
    # -> ["/GPU:0", "/GPU:1", "/CPU:0"]: one tower per device

`configure_devices` must run before TensorFlow initialises its devices (its
first op, or `tf.config.list_logical_devices`): visible devices, memory
growth, memory limits, logical CPUs and thread pools are fixed from then on.
A worker actor is a fresh process and calls it first thing in `setup`.
Settings that change nothing (the defaults on a CPU machine) are accepted in
an initialised process too.

Which GPUs: a Ray actor sees only the GPUs Ray gave it (Ray sets
`CUDA_VISIBLE_DEVICES`), and TensorFlow numbers those 0..n-1. A worker that
asked Ray for no GPU (`gpus_per_worker=0`) hides every GPU from TensorFlow,
so it never computes on a GPU it did not reserve. docs/devices.md maps each
TF1 option to its flag here.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

from towerps.choices import TOWER_BALANCES as BALANCES
from towerps.errors import ConfigError
from towerps.options import Flag, option


def _gpu_list(text: str) -> tuple[int, ...]:
    """--gpus 0,1 -> (0, 1)."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of GPU indices") from None


def _flag(name: str, help: str, **kwargs) -> Flag:
    return Flag(name, help, group="devices", **kwargs)


_SHARED = ("0: TensorFlow's default (a thread per core), or, when several workers share a "
           "node, each worker's share of its cores")


@dataclass(frozen=True)
class DeviceConfig:
    """Devices and TensorFlow runtime options of every worker of a job."""

    # Each field's flag: src/towerps/options.py (the help, --help and README.md).
    # Ray `num_gpus` of each worker actor: one GPU tower per GPU Ray gives it;
    # a fraction below 1 shares a GPU with other actors (set a memory limit).
    gpus_per_worker: float = option(0.0, _flag(
        "--gpus-per-worker", "Ray num_gpus per worker: one GPU tower per GPU; a fraction below "
        "1 shares a GPU (with --gpu-memory-limit-mb)", parse=float, metavar="N"))
    # Which of the worker's visible GPUs hold towers (visible_device_list);
    # None: all of them.
    gpus: tuple[int, ...] | None = option(None, _flag(
        "--gpus", "which of the worker's visible GPUs get towers (default: all)",
        parse=_gpu_list, metavar="I,J"))
    # CPU towers beside the GPU towers; None: one when there is no GPU tower.
    cpu_towers: int | None = option(None, _flag(
        "--cpu-towers", "CPU towers per worker, beside the GPU towers (default: 1 if no GPU, "
        "else 0)", parse=int, metavar="N"))
    cpu_only: bool = option(False, _flag(  # device_count={'GPU': 0}
        "--cpu-only", "no GPU towers, even where GPUs are visible"))
    memory_growth: bool = option(False, _flag(  # allow_growth
        "--memory-growth", "GPU memory grows as needed (allow_growth)"))
    # per GPU tower; per_process_gpu_memory_fraction
    gpu_memory_limit_mb: int | None = option(None, _flag(
        "--gpu-memory-limit-mb", "memory limit of each GPU tower", parse=int, metavar="MB"))
    # Both pools, 0: TensorFlow's default, one per core, or this worker's
    # share of its node's cores when several of the job's workers share it
    # (share_cores; the inter-op pool only in a worker of one tower).
    intra_op_threads: int = option(0, _flag(
        "--intra-op-threads", "TensorFlow's intra-op threads; " + _SHARED, parse=int,
        metavar="N"))
    inter_op_threads: int = option(0, _flag(
        "--inter-op-threads", "TensorFlow's inter-op threads; " + _SHARED, parse=int,
        metavar="N"))
    soft_placement: bool = option(True, _flag(  # allow_soft_placement (TF2's default)
        "--no-soft-placement", "fail on ops that cannot run on the tower's device instead of "
        "moving them"))
    log_device_placement: bool = option(False, _flag(
        "--log-device-placement", "log the device of every op"))
    # equal | measured: rows per tower in proportion to speed
    tower_balance: str = option("equal", _flag(
        "--tower-balance", "rows per tower: equal, or measured (in proportion to each tower's "
        "speed)", choices=BALANCES))

    # Keys older versions wrote that no longer act (src/towerps/options.py's from_dict).
    RETIRED_KEYS = {"slow_tower": "slowdowns are a test seam now (towerps.testing); "
                    "the run goes on at full speed"}

    def __post_init__(self):
        if self.gpus is not None:
            object.__setattr__(self, "gpus", tuple(self.gpus))
        g = self.gpus_per_worker
        if not (g >= 0 and math.isfinite(g)) or (g > 1 and g != int(g)):
            raise ConfigError(
                f"--gpus-per-worker {g} must be 0, a fraction below 1 (to share a GPU) "
                "or a whole number of GPUs"
            )
        if self.gpus is not None:
            if any(i < 0 for i in self.gpus) or len(set(self.gpus)) != len(self.gpus):
                raise ConfigError(
                    f"--gpus {_ints(self.gpus)} must list distinct GPU indices >= 0 "
                    "(indices into the GPUs Ray made visible to the worker, e.g. --gpus 0,1)"
                )
            if self.gpus and g == 0:
                raise ConfigError(
                    f"--gpus {_ints(self.gpus)} needs GPUs, but --gpus-per-worker is 0; "
                    f"ask Ray for them with --gpus-per-worker {max(1, len(self.gpus))}"
                )
            if g >= 1 and len(self.gpus) > g:
                raise ConfigError(
                    f"--gpus {_ints(self.gpus)} names {len(self.gpus)} GPUs but each worker "
                    f"gets {g:g}; use --gpus-per-worker {len(self.gpus)}"
                )
        if self.cpu_only and (g > 0 or self.gpus):
            raise ConfigError(
                f"--cpu-only contradicts --gpus-per-worker {g:g}: a CPU-only worker reserves "
                "no GPU; drop one of them"
            )
        for flag, value in (("--cpu-towers", self.cpu_towers or 0),
                            ("--intra-op-threads", self.intra_op_threads),
                            ("--inter-op-threads", self.inter_op_threads)):
            if value < 0:
                raise ConfigError(f"{flag} must be 0 or more, got {value}")
        if self.num_towers() == 0:
            raise ConfigError(
                "a worker would have zero towers: --cpu-towers is 0 and it uses no GPU; "
                "use --cpu-towers 1 or more, or give workers GPUs with --gpus-per-worker"
            )
        self._check_gpu_memory(g)
        if self.tower_balance not in BALANCES:
            raise ConfigError(
                f"--tower-balance {self.tower_balance!r} is not known; choose one of "
                f"{', '.join(BALANCES)}"
            )

    def _check_gpu_memory(self, g: float) -> None:
        limit = self.gpu_memory_limit_mb
        if limit is not None and limit < 1:
            raise ConfigError(f"--gpu-memory-limit-mb must be at least 1, got {limit}")
        if limit is not None and self.memory_growth:
            raise ConfigError(
                "--memory-growth and --gpu-memory-limit-mb exclude each other in TensorFlow "
                "(a limited logical GPU cannot also grow); choose one"
            )
        if limit is not None and not self.uses_gpus:
            raise ConfigError(
                f"--gpu-memory-limit-mb {limit} applies to GPU towers, but workers use no "
                "GPU; drop it or set --gpus-per-worker"
            )
        if 0 < g < 1 and limit is None and not self.memory_growth:
            raise ConfigError(
                f"--gpus-per-worker {g:g} shares a GPU, but TensorFlow takes nearly all of a "
                "GPU's memory by default; set --gpu-memory-limit-mb (each job's share) or "
                "--memory-growth"
            )

    @property
    def uses_gpus(self) -> bool:
        return not self.cpu_only and self.gpus_per_worker > 0 and self.gpus != ()

    def num_towers(self) -> int:
        """Towers per worker as far as the config alone tells (GPUs as Ray will give them)."""
        if self.gpus is not None:
            gpu_towers = len(self.gpus)
        elif self.uses_gpus:
            gpu_towers = max(1, int(self.gpus_per_worker))  # a fraction still sees one GPU
        else:
            gpu_towers = 0
        cpu = self.cpu_towers if self.cpu_towers is not None else (0 if gpu_towers else 1)
        return gpu_towers + cpu


def plan_gpus(config: DeviceConfig, num_visible: int, total_mb: Sequence[int] | None,
              assigned: str) -> list[int]:
    """Which visible GPUs get towers; ConfigError when the config cannot hold here.

    `num_visible`: GPUs TensorFlow sees in this process; `total_mb`: their
    memory (None when unknown); `assigned`: what Ray gave, for messages.
    """
    if not config.uses_gpus:
        return []
    if num_visible == 0:
        raise ConfigError(
            f"this worker was given GPUs (--gpus-per-worker {config.gpus_per_worker:g}; "
            f"{assigned}) but TensorFlow sees none: install TensorFlow with CUDA "
            "(pip install 'towerps[gpu]'), or train on CPUs with --gpus-per-worker 0"
        )
    wanted = max(1, math.ceil(config.gpus_per_worker))  # a fraction still sees one GPU
    if config.gpus is None and num_visible < wanted:
        raise ConfigError(
            f"--gpus-per-worker {config.gpus_per_worker:g} but TensorFlow sees only "
            f"{num_visible} GPU(s) ({assigned}); ask for {num_visible} or fix the GPU set-up"
        )
    # Outside Ray more GPUs may be visible than asked for: the first ones serve.
    chosen = list(config.gpus) if config.gpus is not None else list(range(wanted))
    missing = [i for i in chosen if i >= num_visible]
    if missing:
        raise ConfigError(
            f"--gpus {_ints(chosen)}: GPU {_ints(missing)} does not exist; this worker sees "
            f"{num_visible} GPU(s), indices 0..{num_visible - 1} ({assigned})"
        )
    limit = config.gpu_memory_limit_mb
    if limit is not None and total_mb is not None:
        for i in chosen:
            if limit > total_mb[i]:
                raise ConfigError(
                    f"--gpu-memory-limit-mb {limit} is larger than GPU {i}'s "
                    f"{total_mb[i]} MB; use at most {total_mb[i]}"
                )
    return chosen


def share_cores(config: DeviceConfig, sharing: int, cores: int | None = None) -> DeviceConfig:
    """`config` for one of `sharing` workers of a job that compute on one node.

    TensorFlow's default pools have a thread per core in every process
    (intra-op: the threads of one op; inter-op: ops run side by side), so
    two workers on one node run twice as many threads in each pool as
    there are cores, and each pool's threads spin for work while the other
    process's need the core. Each pool the user left to TensorFlow (0)
    gets this worker's share of the `cores` the process may run on (all of
    them by default), at least one; the inter-op pool only when the worker
    has one tower, since several towers run their steps side by side on
    it. One worker alone on its node keeps TensorFlow's defaults.
    """
    if sharing <= 1:
        return config
    cores = cores if cores is not None else _usable_cores()
    share = max(1, cores // sharing)
    inter = share if config.num_towers() == 1 else 0
    return replace(config, intra_op_threads=config.intra_op_threads or share,
                   inter_op_threads=config.inter_op_threads or inter)


def _usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):  # Linux
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def tensorflow_threads() -> dict[str, int]:
    """The threads of this process's TensorFlow pools as it holds them (0: its default)."""
    import tensorflow as tf

    return {"intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
            "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads()}


def configure_devices(config: DeviceConfig, assigned_gpus: Sequence | None = None) -> list[str]:
    """Apply `config` to this process's TensorFlow; returns one device per tower.

    GPU towers first ("/GPU:0", ...), then CPU towers ("/CPU:0", ...; several
    are logical CPU devices on the same cores). `assigned_gpus`: the GPU ids
    Ray gave this actor (ray.get_gpu_ids()), used in messages. Raises
    ConfigError for settings this machine cannot honour, or when TensorFlow
    is already initialised with different settings. Not thread-safe.
    """
    import tensorflow as tf  # here, so that the config above imports without TF

    assigned = f"Ray assigned GPU ids {list(assigned_gpus)}" if assigned_gpus is not None \
        else "not in a Ray actor"
    try:
        return _apply(tf, config, assigned)
    except RuntimeError as err:  # TF: "... cannot be modified after being initialized"
        raise ConfigError(
            f"device settings must be applied before TensorFlow initialises its devices "
            f"({err}); call configure_devices first thing in a fresh process"
        ) from None


def _apply(tf, config: DeviceConfig, assigned: str) -> list[str]:
    if config.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(config.intra_op_threads)
    if config.inter_op_threads:
        tf.config.threading.set_inter_op_parallelism_threads(config.inter_op_threads)
    tf.config.set_soft_device_placement(config.soft_placement)
    tf.debugging.set_log_device_placement(config.log_device_placement)

    physical = tf.config.list_physical_devices("GPU")
    total_mb = _gpu_total_mb(len(physical)) if config.gpu_memory_limit_mb else None
    chosen = plan_gpus(config, len(physical), total_mb, assigned)
    if physical:
        tf.config.set_visible_devices([physical[i] for i in chosen], "GPU")
    for i in chosen:
        if config.memory_growth:
            tf.config.experimental.set_memory_growth(physical[i], True)
        if config.gpu_memory_limit_mb:
            tf.config.set_logical_device_configuration(
                physical[i],
                [tf.config.LogicalDeviceConfiguration(memory_limit=config.gpu_memory_limit_mb)],
            )
    num_cpu = config.cpu_towers if config.cpu_towers is not None else (0 if chosen else 1)
    if num_cpu > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num_cpu)]
        )
    # Initialises the runtime: from here on the settings above are fixed.
    logical = {d.name.replace("/device:", "/") for d in tf.config.list_logical_devices()}
    devices = [f"/GPU:{j}" for j in range(len(chosen))] + [f"/CPU:{j}" for j in range(num_cpu)]
    absent = [d for d in devices if d not in logical]
    if absent:
        raise ConfigError(
            f"TensorFlow did not create the tower devices {absent} (it has {sorted(logical)}); "
            "it was initialised earlier with other settings: configure devices in a fresh process"
        )
    return devices


def _gpu_total_mb(count: int) -> list[int] | None:
    """Total memory of each visible CUDA device, in MB, from the driver API.

    TensorFlow does not report a GPU's size before it initialises, and after
    that a memory limit can no longer be set. The driver API counts devices
    as CUDA_VISIBLE_DEVICES leaves them, as TensorFlow does. None when the
    driver cannot be asked (the limit is then left to TensorFlow).
    """
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    found = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(found)) != 0:
        return None
    totals = []
    for ordinal in range(min(count, found.value)):
        device, size = ctypes.c_int(0), ctypes.c_size_t(0)
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
            return None
        if cuda.cuDeviceTotalMem_v2(ctypes.byref(size), device) != 0:
            return None
        totals.append(size.value // (1024 * 1024))
    return totals if len(totals) == count else None


def _ints(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)
