"""Optimizers a parameter-server shard applies to the variables it owns.

Plain numpy, no TensorFlow: a shard is a light CPU process. Each update
repeats the float32 arithmetic of Keras 3's own optimizer step for step
(`keras/src/optimizers/sgd.py`, `adam.py`), so that training through the
shards gives the weights training with Keras would give.

    opt = make_optimizer("adam")              # lr from DEFAULT_LR
    opt.apply(params, grads)                  # params updated in place
    checkpoint = opt.state()                  # slots + iterations
    in_keras = opt.keras_state()              # the same, named as Keras' optimizer names it

Contract of `apply`: all or nothing. It validates every gradient, and
proves the update finite, before it touches any variable: a bad push, or
an update that would make any variable or slot NaN or infinite
(NotFinite), leaves the shard's weights and slots as they were. The proof
is cheap when it can be: the largest magnitudes of a variable, its
gradient and its slots bound what the update can reach (`_bounded`), and
only a variable whose bound comes near float32's largest value has its
update tried first on block-sized copies (`_refuse_nonfinite`).
Updates are element-wise, so they run over flat blocks of BLOCK_ELEMENTS
(`flat_blocks`): the same arithmetic per element, with temporaries of one
block (in cache) rather than of a whole variable.

Embedding tables: a gradient may be a RowSparse (the rows a step touched).
An optimizer whose zero-gradient update changes nothing
(`zero_gradient_is_identity`: sgd, adagrad) updates those rows alone, bit
for bit the dense update; the others update every row (`tables="exact"`,
untouched rows' moments decay) or, with `tables="lazy"`, the touched rows
alone with their own slots (ps/tables.py).

Not thread safe: the shard holds its lock around `apply`, `state` and
`load_state`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from towerps.choices import DEFAULT_LR, OPTIMIZERS, TABLE_OPTIMIZERS
from towerps.errors import BadTensor, ConfigError, NotFinite
from towerps.ps.checks import FLT_MAX, peak_magnitude
from towerps.ps.tables import Operands, operands
from towerps.sparse import RowSparse

_F32 = np.float32
_ITERATIONS_KEY = "iterations"
BLOCK_ELEMENTS = 1 << 16  # 256 KiB of float32
# What `_bounded` lets an update reach without a trial: a quarter of float32's
# largest value, room for the rounding of the float32 arithmetic it bounds.
HEADROOM = FLT_MAX / 4


def flat_blocks(*arrays: np.ndarray):
    """Matching flat views of blocks of same-sized arrays: (a[i:j], b[i:j], ...).

    The first array is written through its views, so it must be contiguous;
    the others are only read (a non-contiguous one is copied once).
    """
    if not arrays[0].flags.c_contiguous:
        raise ValueError("flat_blocks writes through the first array: it must be contiguous")
    flats = [arrays[0].reshape(-1), *(np.ascontiguousarray(a).reshape(-1) for a in arrays[1:])]
    size = flats[0].size
    for start in range(0, size, BLOCK_ELEMENTS):
        stop = min(start + BLOCK_ELEMENTS, size)
        yield tuple(f[start:stop] for f in flats)


@dataclass
class KerasState:
    """An optimizer's state named as the Keras optimizer that runs the same
    update names it: `slots[attribute][variable]` is the array Keras keeps in
    `optimizer.<attribute>[i]` for variable i (Adam: "_momentums",
    "_velocities"; SGD with momentum: "momentums"), `scalars[attribute]` a
    Variable attribute of the optimizer itself ("_iterations"). Variables are
    a shard's names (slices, "0003/kernel:1") or, once joined, whole keys.
    """

    slots: dict[str, dict[str, np.ndarray]]
    scalars: dict[str, np.ndarray]

    @property
    def iterations(self) -> int:
        return int(self.scalars.get(ITERATIONS_ATTRIBUTE, 0))


ITERATIONS_ATTRIBUTE = "_iterations"  # Keras' optimizer.iterations counter


class Optimizer:
    """Updates numpy float32 variables in place from their gradients.

    Slots (momentum, Adam's moments) are created lazily, filled with
    `_slot_initial` (zero), the first time a variable name is updated.
    `iterations` counts `apply` calls, as Keras' `optimizer.iterations`
    counts `apply_gradients` calls. `tables` ("exact" or "lazy", one of
    TABLE_OPTIMIZERS) says how a row-sparse gradient is applied (module
    docstring).
    """

    name = "base"
    slot_names: tuple[str, ...] = ()
    # slot -> the list attribute of the Keras optimizer with the same update
    keras_slots: dict[str, str] = {}

    def __init__(self, lr: float, *, tables: str = "exact"):
        self.lr = _check_lr(self.name, lr)
        self.tables = check_tables(tables)
        self.iterations = 0
        # slot name -> variable name -> array shaped like the variable
        self._slots: dict[str, dict[str, np.ndarray]] = {s: {} for s in self.slot_names}

    def apply(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray],
              lr_scale: float = 1.0) -> None:
        """One update of every variable named in `grads`, in place.

        `lr_scale` multiplies the learning rate of this update only (staleness
        aware async SGD scales down late gradients). Raises BadTensor, before
        changing anything, if a gradient names no variable or has another
        shape, and NotFinite if the update would make any variable or slot
        NaN or infinite.
        """
        if isinstance(lr_scale, bool) or not isinstance(lr_scale, numbers.Real) \
                or not math.isfinite(lr_scale) or lr_scale <= 0:
            raise ConfigError(f"lr_scale={lr_scale!r} must be a finite number > 0")
        checked = {name: _checked_grad(name, params, g) for name, g in grads.items()}
        # Keras keeps lr in a float32 variable: round the scaled rate once, the same way.
        lr = _F32(self.lr * lr_scale)
        # Slots too are checked (and created) before the first variable changes.
        slots = {name: {s: self._slot(s, name, params[name].shape) for s in self.slot_names}
                 for name in checked}
        by_rows = self.updates_by_rows
        work = {name: operands(params[name], g, slots[name], by_rows)
                for name, g in checked.items()}
        unproven = {name: ops for name, ops in work.items()
                    if not self._proven_finite(float(lr), ops.value, ops.grad, ops.slots)}
        self._refuse_nonfinite(unproven, lr)
        for ops in work.values():
            names = list(ops.slots)
            for w, g, *slot_blocks in flat_blocks(ops.value, ops.grad, *ops.slots.values()):
                self._update(w, g, dict(zip(names, slot_blocks)), lr)
            ops.write_back()
        self.iterations += 1

    @property
    def updates_by_rows(self) -> bool:
        """Whether a row-sparse gradient updates its rows alone (ps/tables.py):
        always when that is the dense update (`zero_gradient_is_identity`),
        else under `tables="lazy"`."""
        return self.zero_gradient_is_identity or self.tables == "lazy"

    @property
    def zero_gradient_is_identity(self) -> bool:
        """Whether a gradient of +0.0 leaves a value and its slots as they
        are, bit for bit (-0.0 included): then the rows a step did not touch
        need no update at all. False unless an optimizer proves it."""
        return False

    def _proven_finite(self, lr: float, w, g, slots: dict[str, np.ndarray]) -> bool:
        """Whether the update of variable `w` by gradient `g` provably stays
        within HEADROOM, from the largest magnitudes of the arrays alone."""
        peaks = [peak_magnitude(a) for a in (w, g, *slots.values())]
        if not all(math.isfinite(p) for p in peaks):
            return False
        return self._bounded(lr, peaks[0], peaks[1], dict(zip(slots, peaks[2:])))

    def _bounded(self, lr: float, value: float, grad: float, slots: dict[str, float]) -> bool:
        """Whether an update of a variable whose largest magnitude is `value`,
        with a gradient and slots of these (finite) largest magnitudes, stays
        within HEADROOM, intermediate results included. False: not proven."""
        return False

    def _refuse_nonfinite(self, work: dict[str, Operands], lr) -> None:
        """Raise NotFinite if this update of `work` (variable name -> its
        operands) would make any variable or slot NaN or infinite. It runs
        the update on copies of each block (in cache: no memory beyond a
        block per array), so the update `apply` makes next is bit for bit
        the one checked here; it costs about one more update of `work`,
        which `_bounded` spares almost always."""
        scratch = [np.empty(BLOCK_ELEMENTS, _F32) for _ in range(1 + len(self.slot_names))]
        for name, ops in work.items():
            names = list(ops.slots)
            for w, g, *slot_blocks in flat_blocks(ops.value, ops.grad, *ops.slots.values()):
                copies = [s[:w.size] for s in scratch]
                for copy, block in zip(copies, (w, *slot_blocks)):
                    np.copyto(copy, block)
                with np.errstate(over="ignore", invalid="ignore"):
                    self._update(copies[0], g, dict(zip(names, copies[1:])), lr)
                for what, copy in zip(("value", *(f"{s} slot" for s in names)), copies):
                    if not np.isfinite(copy).all():
                        raise NotFinite(f"{self.name} would make the {what} of {name!r} NaN "
                                        "or infinite")

    def state(self) -> dict[str, np.ndarray]:
        """A copy of the slots (keys "<slot>/<variable>") and of `iterations`."""
        out = {_ITERATIONS_KEY: np.array(self.iterations, dtype=np.int64)}
        for slot, by_var in self._slots.items():
            for var, arr in by_var.items():
                out[f"{slot}/{var}"] = arr.copy()
        return out

    def keras_state(self) -> KerasState:
        """A copy of the slots and `iterations`, named as Keras names them (KerasState)."""
        slots = {self.keras_slots[slot]: {var: arr.copy() for var, arr in by_var.items()}
                 for slot, by_var in self._slots.items()}
        return KerasState(slots, {ITERATIONS_ATTRIBUTE: np.array(self.iterations, np.int64)})

    def load_state(self, state: dict[str, np.ndarray], params: dict | None = None) -> None:
        """Replace slots and `iterations` with those of `state()` output.

        `params` (the variables the state belongs to) lets an optimizer that
        builds its slots lazily build them first; the numpy ones ignore it."""
        if _ITERATIONS_KEY not in state:
            raise BadTensor(f"optimizer state has no {_ITERATIONS_KEY!r} entry; "
                            "pass the dict that Optimizer.state() returned")
        slots: dict[str, dict[str, np.ndarray]] = {s: {} for s in self.slot_names}
        for key, arr in state.items():
            if key == _ITERATIONS_KEY:
                continue
            slot, _, var = key.partition("/")
            if slot not in slots or not var:
                raise BadTensor(f"optimizer state key {key!r} is not a slot of {self.name!r} "
                                f"(slots: {self.slot_names}); was it saved by another optimizer?")
            slots[slot][var] = np.array(arr, dtype=_F32)  # a copy: the caller keeps its arrays
        self._slots = slots
        self.iterations = int(state[_ITERATIONS_KEY])

    def _slot(self, slot: str, var: str, shape: tuple) -> np.ndarray:
        arr = self._slots[slot].get(var)
        if arr is None:
            initial = self._slot_initial(slot)  # zeros: calloc's pages, touched when used
            arr = self._slots[slot][var] = (np.zeros(shape, dtype=_F32) if initial == 0
                                            else np.full(shape, initial, dtype=_F32))
        elif arr.shape != shape:
            raise BadTensor(f"slot {slot}/{var} has shape {arr.shape} but the gradient has "
                            f"{shape}; the optimizer state belongs to another model")
        return arr

    def _slot_initial(self, slot: str) -> float:
        """The value a new slot starts at (Keras' initializer of that slot)."""
        return 0.0

    def _update(self, w: np.ndarray, g: np.ndarray, slots: dict[str, np.ndarray],
                lr: np.float32) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(lr={self.lr}, iterations={self.iterations})"


class SGD(Optimizer):
    """w -= lr * g"""

    name = "sgd"

    @property
    def zero_gradient_is_identity(self) -> bool:
        return True  # lr > 0 and finite: +0.0 * lr is +0.0, and x - +0.0 is x

    def _bounded(self, lr, value, grad, slots):
        return value + lr * grad <= HEADROOM

    def _update(self, w, g, slots, lr):
        w -= g * lr


class Momentum(Optimizer):
    """Keras SGD(momentum=0.9, nesterov=False): m = 0.9*m - lr*g; w += m."""

    name = "momentum"
    slot_names = ("momentum",)
    # Keras' velocity has the same sign: both add m to w.
    keras_slots = {"momentum": "momentums"}

    def __init__(self, lr: float, momentum: float = 0.9, *, tables: str = "exact"):
        super().__init__(lr, tables=tables)
        self.momentum = momentum

    def _bounded(self, lr, value, grad, slots):
        m = abs(self.momentum) * slots["momentum"] + lr * grad
        return m <= HEADROOM and value + m <= HEADROOM

    def _update(self, w, g, slots, lr):
        m = slots["momentum"]
        m *= _F32(self.momentum)
        m -= g * lr
        w += m


class Adam(Optimizer):
    """Keras 3 Adam (amsgrad off), in Keras' order of operations:

        alpha = lr * sqrt(1 - beta_2**t) / (1 - beta_1**t)     t = iterations + 1
        m += (g - m) * (1 - beta_1)
        v += (g*g - v) * (1 - beta_2)
        w -= (m * alpha) / (sqrt(v) + epsilon)

    The bias correction sits in `alpha` and epsilon is added to the
    uncorrected sqrt(v): this is the paper's "epsilon hat", not Algorithm 1.
    """

    name = "adam"
    slot_names = ("m", "v")
    keras_slots = {"m": "_momentums", "v": "_velocities"}

    def __init__(self, lr: float, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-7, *, tables: str = "exact"):
        super().__init__(lr, tables=tables)
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon

    def _bounded(self, lr, value, grad, slots):
        t = self.iterations + 1
        if not (0 <= self.beta_1 < 1 and 0 <= self.beta_2 <= 1 and self.epsilon > 0):
            return False  # hyperparameters this bound does not cover: try the update
        alpha = lr * math.sqrt(1 - self.beta_2**t) / (1 - self.beta_1**t)
        m = max(slots["m"], grad)  # m and v move towards g and g*g
        v = max(slots["v"], grad * grad)
        step = m * alpha / self.epsilon  # sqrt(v) + epsilon >= epsilon
        return max(m, v, m * alpha, value + step) <= HEADROOM

    def _update(self, w, g, slots, lr):
        m, v = slots["m"], slots["v"]
        t = _F32(self.iterations + 1)
        one = _F32(1)
        # float32 scalars throughout, as Keras casts every constant to the variable dtype.
        alpha = lr * np.sqrt(one - _F32(self.beta_2) ** t) / (one - _F32(self.beta_1) ** t)
        tmp = np.subtract(g, m)                   # g - m
        tmp *= _F32(1 - self.beta_1)
        m += tmp
        np.square(g, out=tmp)                     # g*g - v
        tmp -= v
        tmp *= _F32(1 - self.beta_2)
        v += tmp
        np.sqrt(v, out=tmp)                       # denominator
        tmp += _F32(self.epsilon)
        step = m * alpha
        step /= tmp
        w -= step


class Adagrad(Optimizer):
    """Keras 3 Adagrad, in Keras' order of operations:

        a += g*g                        a starts at initial_accumulator_value
        w -= (lr * g) / sqrt(a + epsilon)
    """

    name = "adagrad"
    slot_names = ("accumulator",)
    keras_slots = {"accumulator": "_accumulators"}

    def __init__(self, lr: float, initial_accumulator_value: float = 0.1,
                 epsilon: float = 1e-7, *, tables: str = "exact"):
        super().__init__(lr, tables=tables)
        self.initial_accumulator_value, self.epsilon = initial_accumulator_value, epsilon

    @property
    def zero_gradient_is_identity(self) -> bool:
        # a + 0 is a; (lr * +0.0) / sqrt(a + epsilon) is +0.0 when a + epsilon > 0
        # (a >= its start >= 0), and x - +0.0 is x. Without that, 0/0 is NaN.
        return self.epsilon > 0 and self.initial_accumulator_value >= 0

    def _slot_initial(self, slot):
        return self.initial_accumulator_value

    def _bounded(self, lr, value, grad, slots):
        if not self.zero_gradient_is_identity:
            return False  # hyperparameters this bound does not cover: try the update
        a = slots["accumulator"] + grad * grad
        step = lr * grad / math.sqrt(self.epsilon)  # sqrt(a + epsilon) >= sqrt(epsilon)
        return max(a, lr * grad, value + step) <= HEADROOM

    def _update(self, w, g, slots, lr):
        a = slots["accumulator"]
        a += np.square(g)
        denominator = a + _F32(self.epsilon)
        np.sqrt(denominator, out=denominator)
        step = g * lr
        step /= denominator
        w -= step


_CLASSES = {cls.name: cls for cls in (SGD, Momentum, Adam, Adagrad)}


@dataclass(frozen=True)
class OptimizerSpec:
    """What every shard of a job runs; plain data that travels to the shards.

    `keras_config` None: the numpy optimizer `name` (one of OPTIMIZERS) with
    `lr` and the hyperparameters `hyper`; otherwise Keras' own optimizer
    rebuilt from that `keras.optimizers.serialize` output
    (ps/keras_optimizer.py). `whole_variables`: its update looks at whole
    variables, so none may be sliced. `global_clipnorm`: each worker clips its
    gradient to this global norm before pushing.
    `exclude_from_weight_decay`: the regular expression Keras'
    `exclude_from_weight_decay(var_names=...)` made, matched against the
    variables' short names ("bias"). `table_optimizer`: how a row-sparse
    gradient is applied, "exact" or "lazy" (ps/tables.py; a Keras optimizer
    takes "exact" only).
    """

    name: str
    lr: float | None = None
    hyper: tuple = ()  # ((hyperparameter, value), ...) of the numpy optimizer
    keras_config: dict | None = field(default=None, compare=False)
    whole_variables: bool = False
    global_clipnorm: float | None = None
    exclude_from_weight_decay: str | None = None  # Keras: the var_names pattern
    table_optimizer: str = "exact"  # one of TABLE_OPTIMIZERS

    @property
    def runs_keras(self) -> bool:
        return self.keras_config is not None

    def build(self) -> Optimizer:
        if self.keras_config is None:
            optimizer = make_optimizer(self.name, self.lr, self.table_optimizer)
            for key, value in self.hyper:
                setattr(optimizer, key, value)
            return optimizer
        from towerps.ps.keras_optimizer import KerasOptimizer

        return KerasOptimizer(self.keras_config, self.exclude_from_weight_decay,
                              self.table_optimizer)


def make_optimizer(name: str, lr: float | None = None, tables: str = "exact") -> Optimizer:
    """The optimizer called `name` (one of OPTIMIZERS); lr None → DEFAULT_LR[name];
    `tables` how it applies a row-sparse gradient (one of TABLE_OPTIMIZERS)."""
    if name not in _CLASSES:
        raise ConfigError(f"unknown optimizer {name!r}; choose one of {OPTIMIZERS}")
    return _CLASSES[name](DEFAULT_LR[name] if lr is None else lr, tables=tables)


def check_tables(tables: str) -> str:
    """`tables` if it is one of TABLE_OPTIMIZERS; ConfigError naming them otherwise."""
    if tables not in TABLE_OPTIMIZERS:
        raise ConfigError(f"--table-optimizer {tables!r} is not known; choose one of "
                          f"{', '.join(TABLE_OPTIMIZERS)}")
    return tables


def _check_lr(name: str, lr) -> float:
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real) \
            or not math.isfinite(lr) or lr <= 0:
        raise ConfigError(f"learning rate lr={lr!r} for optimizer {name!r} must be a finite "
                          f"number > 0 (default {DEFAULT_LR.get(name)})")
    return float(lr)


def _checked_grad(name: str, params: dict[str, np.ndarray], grad):
    """`grad` as a float32 array (a RowSparse: with float32 rows), after
    checking it against variable `name`. A RowSparse's ids were checked
    where it came in (ps/checks.py)."""
    if name not in params:
        raise BadTensor(f"gradient for unknown variable {name!r}; this shard holds "
                        f"{sorted(params)[:10]}{' ...' if len(params) > 10 else ''}")
    if isinstance(grad, RowSparse):
        var = params[name]
        if grad.shape != var.shape or len(grad.ids) != len(grad.rows):
            raise BadTensor(f"gradient {name!r} has shape {grad.shape} ({len(grad.ids)} ids "
                            f"for {len(grad.rows)} rows), variable has {var.shape}")
        rows = _checked_grad(name, {name: var[:len(grad.rows)]}, grad.rows)
        return RowSparse(grad.ids, rows, grad.num_rows)
    var, grad = params[name], np.asarray(grad)
    if grad.shape != var.shape:
        raise BadTensor(f"gradient {name!r} has shape {grad.shape}, variable has {var.shape}")
    if var.dtype != _F32:
        raise BadTensor(f"variable {name!r} is {var.dtype}; shard variables must be float32")
    if not np.issubdtype(grad.dtype, np.floating):
        raise BadTensor(f"gradient {name!r} is {grad.dtype}; send a float32 array")
    return grad.astype(_F32, copy=False)
