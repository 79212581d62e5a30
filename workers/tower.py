"""A tower: one model replica on one device that computes gradients.

    tower = Tower(model, device="/CPU:0")
    tower.set_weights(params)                 # {variable key: array, or RowSparse of rows}
    updates, loss = tower.compute_gradients(x, y)
    ids = tower.row_ids(x)                    # {table key: int64 ids x looks up}, or None

Variables are keyed by the model's structure (workers/variables.py). The
loss is the model's own: what `model.compile(loss=...)` set, summed over
outputs, plus the model's regularisation losses (`model.losses`), exactly as
`model.fit` computes it; `loss=` gives one explicitly for a model compiled
without one. `x` and `y` may be arrays or nests of them (several inputs or
outputs), as `model.fit` takes them.

`updates` holds, per travelling variable, what the shard needs: the
gradient of the mean loss over the examples given for a trainable variable,
and the variable's new value after this forward pass for float state
(BatchNormalization's moving statistics, updated by `training=True`). Both
combine across towers and workers as an example-weighted mean. A variable
whose gradient TensorFlow gives as an IndexedSlices (a Keras Embedding's
table) gets a RowSparse (src/towerps/sparse.py): the rows the batch looked
up, each once, summed, whose `to_dense()` is bit for bit the dense gradient
TensorFlow's own conversion makes.

Row pulls: a worker that knows which rows of each table its next batch
looks up (`row_ids`) pulls those alone and hands them to `set_weights` as a
RowSparse, which is scattered into the table; the other rows keep what they
held, which the batch does not read. `row_ids` runs an "ids model", built
once from a functional or Sequential model: its inputs to each Embedding
layer's input, without gradients. A table counts once its first gradient
was row-sparse (an IndexedSlices: nothing but lookups read it, no
regulariser, no tied weights). A model whose Embedding inputs the
functional graph does not expose (subclassed, a layer called twice, a
nested model) pulls its tables whole: logged once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import keras
import numpy as np
import tensorflow as tf

from towerps.errors import BadTensor, ConfigError
from towerps.sparse import RowSparse
from towerps.wire import TENSOR_ALIGNMENT
from towerps.workers.variables import ModelVariables

logger = logging.getLogger(__name__)


class Tower:
    def __init__(self, model: keras.Model, device: str = "/CPU:0", loss=None):
        self.model = model
        self.device = device
        self.variables = ModelVariables(model)
        self._trainable = self.variables.trainable
        self._state = self.variables.state
        self._travelling = self.variables.all
        # Each variable's numpy dtype: what an array must be to be adopted.
        self._dtypes = [np.dtype(tf.as_dtype(v.dtype).as_numpy_dtype)
                        for v in self._travelling.values()]
        self._loss = _resolve_loss(model, loss)
        self._grad_fn = None  # traced at the first batch, for any batch size
        self._sparse: list[bool] = []  # per trainable variable: row-sparse (set by the trace)
        # Every assignment in one call: one dispatch per step, not one per variable.
        # A table's rows (RowSparse) are scattered; their count changes every step.
        self._assign_fn = tf.function(self._assign_all, reduce_retracing=True)
        self._ids_model, self._tables = _ids_model(model, self.variables)
        self._ids_fn = None  # traced at the first row_ids, for any batch size

    @property
    def variable_names(self) -> list[str]:
        """Keys of every variable that travels: trainable, then state."""
        return list(self._travelling)

    @property
    def trainable_names(self) -> list[str]:
        return list(self._trainable)

    @property
    def has_tables(self) -> bool:
        """Whether `row_ids` can name the rows of any table (it may still
        answer None until the first gradient shows which are row-sparse)."""
        return self._ids_model is not None

    @property
    def table_names(self) -> list[str]:
        """Keys of the trainable tables of every Embedding layer in the model,
        nested ones included, whether or not `row_ids` can name their rows:
        what the placement spreads over the shards by row id
        (ps/placement.py). Known before any gradient; a table whose gradient
        turns out dense (a regulariser) is placed the same way, correctly."""
        return [key for key in map(self._trainable_key, _embedding_tables(self.model))
                if key is not None]

    def _trainable_key(self, variable) -> str | None:
        try:
            key = self.variables.key_of(variable)
        except KeyError:  # not among the model's variables
            return None
        return key if key in self._trainable else None

    @property
    def state_names(self) -> list[str]:
        return list(self._state)

    def variable_bytes(self) -> dict[str, int]:
        return {n: int(np.prod(v.shape)) * 4 for n, v in self._travelling.items()}

    def get_weights(self) -> dict[str, np.ndarray]:
        return {n: np.asarray(v.numpy(), dtype=np.float32) for n, v in self._travelling.items()}

    def set_weights(self, params: Mapping[str, np.ndarray], adopt: bool = False) -> None:
        """Assign every travelling variable; `params` must name each one exactly,
        in its shape. All or nothing: a wrong `params` raises BadTensor first.

        `adopt`: the caller hands the arrays over (a worker's freshly pulled
        parameters) and must not write to them or read them for these
        values afterwards. Each one that TensorFlow can take as it is
        (`_adoptable`) reaches the assignment without a copy on the way,
        through DLPack, and a CPU variable may keep its memory: the pulled
        bytes are then copied once, from the segment or the stream, instead
        of three times. Otherwise every array is copied, as `adopt=False`."""
        if set(params) != set(self._travelling):
            raise BadTensor(
                "parameters do not match the model: missing "
                f"{sorted(set(self._travelling) - set(params))}, "
                f"unknown {sorted(set(params) - set(self._travelling))}"
            )
        wrong = [f"{name}: {_shape(params[name])} for {tuple(variable.shape)}"
                 for name, variable in self._travelling.items()
                 if _shape(params[name]) != tuple(variable.shape)]
        if wrong:
            raise BadTensor(f"parameters of the wrong shape (nothing was set): {wrong[:5]}")
        values = [params[name] for name in self._travelling]
        rows = tuple(isinstance(value, RowSparse) for value in values)
        if any(rows):
            values = [(v.ids, v.rows) if r else v for v, r in zip(values, rows)]
        elif adopt:
            values = [_as_tensor(value, dtype) for value, dtype in zip(values, self._dtypes)]
        self._assign_fn(values, rows if any(rows) else None)

    def _assign_all(self, values, rows) -> None:
        """Assign each variable its value, or (`rows`[i] set) scatter its
        (ids, rows) into it: the rows of those ids, and nothing else, change."""
        for i, (variable, value) in enumerate(zip(self._travelling.values(), values)):
            if rows is not None and rows[i]:
                ids, new_rows = value
                variable.value.scatter_update(tf.IndexedSlices(new_rows, ids))
            else:
                variable.assign(value)

    def row_ids(self, x) -> dict[str, np.ndarray] | None:
        """{table key: the int64 ids, ascending without repeats, that a
        forward pass over `x` looks up}, for each table whose gradient is
        row-sparse; None when there is none (or no gradient was made yet):
        then a pull brings every variable whole."""
        if self._ids_model is None or not any(self._sparse):
            return None
        sparse = dict(zip(self._trainable, self._sparse))
        tables = [key for key in self._tables if sparse.get(key)]
        if not tables:
            return None
        if self._ids_fn is None:
            spec = tf.nest.map_structure(
                lambda t: tf.TensorSpec((None, *np.shape(t)[1:]), np.asarray(t).dtype), x)
            self._ids_fn = tf.function(self._lookups, input_signature=[spec], autograph=False)
        found = dict(zip(self._tables, self._ids_fn(x)))
        return {key: np.unique(found[key].numpy()) for key in tables}

    def _lookups(self, x):
        """Each table's looked-up ids, as its Embedding casts them (int64 [n])."""
        out = []
        for t in tf.nest.flatten(self._ids_model(x, training=False)):
            if t.dtype not in (tf.int32, tf.int64):
                t = tf.cast(t, tf.int32)  # keras' Embedding.call
            out.append(tf.cast(tf.reshape(t, [-1]), tf.int64))
        return out

    def _gradients(self, x, y):
        with tf.device(self.device):
            with tf.GradientTape() as tape:
                y_pred = self.model(x, training=True)
                loss = self._loss(x, y, y_pred)
            grads = tape.gradient(loss, list(self._trainable.values()))
        missing = [n for n, g in zip(self._trainable, grads) if g is None]
        if missing:
            raise ConfigError(f"the loss does not depend on trainable variables {missing}; "
                              "mark them trainable=False or use them in the model's output")
        # Known at trace time: which gradients are IndexedSlices (an Embedding's).
        self._sparse = [isinstance(g, tf.IndexedSlices) for g in grads]
        grads = [_summed_rows(g) if sparse else g for g, sparse in zip(grads, self._sparse)]
        return loss, grads, [v.value for v in self._state.values()]

    def compute_gradients(self, x, y) -> tuple[dict[str, np.ndarray], float]:
        """Per variable key: the gradient (trainable) or new value (state); and the mean loss.

        x, y: arrays (or nests of arrays) whose first axis is the examples.
        The arrays of a CPU tower are read-only views of TensorFlow's results.
        """
        x, y = tf.nest.map_structure(tf.convert_to_tensor, (x, y))
        if self._grad_fn is None:
            # One trace for any batch size: the signature leaves the batch open.
            spec = tf.nest.map_structure(
                lambda t: tf.TensorSpec((None, *t.shape[1:]), t.dtype), (x, y))
            self._grad_fn = tf.function(self._gradients, input_signature=list(spec))
        loss, grads, state = self._grad_fn(x, y)
        updates = {n: _row_sparse(g, v.shape[0]) if sparse else _host_array(g)
                   for (n, v), g, sparse in zip(self._trainable.items(), grads, self._sparse)}
        updates.update((n, _host_array(s)) for n, s in zip(self._state, state))
        return updates, float(loss)


def _embedding_tables(model: keras.Model) -> list:
    """The `embeddings` variable of each Embedding layer in `model`, at any depth."""
    layers = model._flatten_layers(include_self=False, recursive=True)
    return [layer.embeddings for layer in layers if isinstance(layer, keras.layers.Embedding)]


def _ids_model(model: keras.Model, variables: ModelVariables):
    """(a model from `model`'s inputs to each Embedding layer's input, the
    table keys in its outputs' order), or (None, []) for a model without
    tables or whose tables' inputs cannot be reached that way (logged)."""
    layers = [layer for layer in model.layers if isinstance(layer, keras.layers.Embedding)]
    if not layers:
        return None, []
    try:
        # A layer called more than once: `input` would be its first call's alone.
        shared = [layer.name for layer in layers if len(layer._inbound_nodes) != 1]
        if shared:
            raise ValueError(f"Embedding layers {shared} are called more than once")
        outputs = [layer.input for layer in layers]
        keys = [variables.key_of(layer.embeddings) for layer in layers]
        return keras.Model(_inputs(model), outputs), keys
    except (AttributeError, ValueError, KeyError) as err:
        logger.info("model %r: the inputs of its Embedding layers cannot be read from its "
                    "inputs (%s); its tables are pulled whole every step", model.name, err)
        return None, []


def _inputs(model: keras.Model):
    """The model's inputs in the structure it is called with (a Sequential
    built from an Input has `inputs` but no `input`)."""
    try:
        return model.input
    except (AttributeError, ValueError):
        inputs = model.inputs
        return inputs[0] if len(inputs) == 1 else inputs


def _shape(value) -> tuple:
    return value.shape if isinstance(value, RowSparse) else np.shape(value)


def _summed_rows(grad: tf.IndexedSlices) -> tuple[tf.Tensor, tf.Tensor]:
    """An IndexedSlices gradient (one slice per lookup, repeats included) as
    (ids int64 [k] ascending, rows [k, *row_shape]): each looked-up row once,
    its slices summed. unsorted_segment_sum adds a row's slices in their
    order onto zero, as TensorFlow's own dense conversion
    (tf.convert_to_tensor: unsorted_segment_sum over the table's rows) does:
    the rows are that dense gradient's, bit for bit."""
    ids, position = tf.unique(grad.indices)  # ids in order of first lookup
    rows = tf.math.unsorted_segment_sum(grad.values, position, tf.shape(ids)[0])
    order = tf.argsort(ids)
    return tf.cast(tf.gather(ids, order), tf.int64), tf.gather(rows, order)


def _row_sparse(grad, num_rows: int) -> RowSparse:
    ids, rows = grad
    return RowSparse(ids.numpy(), _host_array(rows), int(num_rows))


def _host_array(tensor) -> np.ndarray:
    """A computed tensor as a float32 numpy array: a CPU tensor's own memory,
    read-only, through DLPack (`.numpy()` copies it, ~0.3 ms for the
    CIFAR-10 CNN's 4.3 MB of gradients), or a copy of any other."""
    if tensor.dtype == tf.float32 and ":CPU:" in tensor.device:
        return np.from_dlpack(tensor)
    return np.asarray(tensor.numpy(), np.float32)


def _as_tensor(array: np.ndarray, dtype: np.dtype):
    """`array` as a CPU tensor over its own memory, where TensorFlow can take
    it (_adoptable); otherwise `array` itself, which the assignment copies."""
    if not _adoptable(array, dtype):
        return array
    return tf.experimental.dlpack.from_dlpack(array.__dlpack__())


def _adoptable(array, dtype: np.dtype) -> bool:
    """A tensor over `array`'s memory is sound: a writable, C-contiguous numpy
    array of the variable's dtype, non-empty, at TensorFlow's alignment
    (TENSOR_ALIGNMENT; the pulled arrays are made so), since TensorFlow's
    kernels abort on a tensor that is not aligned as its allocator aligns."""
    return (isinstance(array, np.ndarray) and array.dtype == dtype
            and array.size > 0 and array.flags.c_contiguous and array.flags.writeable
            and array.ctypes.data % TENSOR_ALIGNMENT == 0)


def _resolve_loss(model: keras.Model, loss):
    """loss(x, y, y_pred) -> scalar: `loss` (a Keras loss or callable) plus model.losses,
    else the compiled loss through `model.compute_loss` (which adds them itself)."""
    if loss is not None:
        loss_fn = keras.losses.get(loss)

        def explicit(x, y, y_pred):
            total = loss_fn(y, y_pred)
            return total + tf.add_n(model.losses) if model.losses else total

        return explicit
    if getattr(model, "_compile_loss", None) is None:
        raise ConfigError(
            f"model {model.name!r} has no loss: compile it with one "
            "(model.compile(optimizer=..., loss=...)) or pass loss= explicitly"
        )
    return lambda x, y, y_pred: model.compute_loss(x=x, y=y, y_pred=y_pred, training=True)
