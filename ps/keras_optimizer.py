"""Any Keras optimizer on a shard: choosing how a shard runs it, and running it.

    spec = optimizer_spec(model.optimizer)     # driver: numpy fast path or Keras
    opt = spec.build()                         # shard: the optimizer it applies
    opt.apply(params, grads)                   # params updated in place

`optimizer_spec` picks the numpy fast path (ps/optimizers.py: sgd, momentum,
adam, adagrad; tests prove them equal to Keras) when the optimizer is exactly one of
those with a constant learning rate and no extras. Everything else runs
Keras' own optimizer on the shard, rebuilt from `keras.optimizers.serialize`
(hyperparameters, LearningRateSchedules, weight decay, clipnorm/clipvalue
travel with it): such a shard imports TensorFlow (~300 MB, seconds of
start-up), which is the price of the job's choice.

Which variables an optimizer may see sliced: Adafactor (factored second
moments), Lamb (a trust ratio per variable), Muon (orthogonalised matrices)
and any optimizer with `clipnorm` (a norm per variable) look at a whole
variable, so their specs say `whole_variables` and placement never cuts a
variable into rows for them. Custom optimizers are treated the same way.
`global_clipnorm` needs every variable's gradient, which no shard holds: the
worker clips its own gradient (all towers combined) before the push, so with
several workers each worker's gradient is clipped, not their mean.

A schedule counts shard updates (`optimizer.iterations` on each shard): one
per step in sync mode, one per push in async/ssp, where every push is an
update, so async reaches a schedule's step k after k / num_workers global
batches.

Embedding tables: Keras' own optimizer updates whole variables, so it
takes `--table-optimizer exact` only (its row-sparse gradients are made
dense); `lazy` is refused with a ConfigError naming the numpy optimizers
that take it (`check_table_optimizer`), rather than falling back: a run
never trains with other arithmetic than the one it asked for.

Refused, with the list of what works: LossScaleOptimizer and
`loss_scale_factor` (the loss is scaled on the worker, the gradient unscaled
on the shard: towerps trains in float32), `use_ema` (the averaged weights
would stay on the shards), MultiOptimizer/OptimizerMap (they pick optimizers
by variable object) and ScheduleFreeAdamW (its weights for evaluation are not
the ones it trains).
"""

from __future__ import annotations

import re

import numpy as np

from towerps.errors import BadTensor, ConfigError, NotFinite
from towerps.ps.optimizers import KerasState, Optimizer, OptimizerSpec
from towerps.sparse import RowSparse

# Keras optimizers whose update is element-wise: a row slice updates as the whole would.
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSprop", "Nadam",
               "Ftrl", "Lion")
# Keras optimizers that look at a whole variable: variables are never sliced for them.
WHOLE_VARIABLE = ("Adafactor", "Lamb", "Muon")
SUPPORTED = ELEMENTWISE + WHOLE_VARIABLE
REFUSED = {
    "LossScaleOptimizer": "it scales the loss on the worker and unscales on the shard; "
                          "towerps trains in float32: use the inner optimizer",
    "MultiOptimizer": "it picks an optimizer by variable object, which shards do not hold",
    "OptimizerMap": "it picks an optimizer by variable object, which shards do not hold",
    "ScheduleFreeAdamW": "the weights it evaluates are not the ones it trains",
}


def optimizer_spec(optimizer) -> OptimizerSpec:
    """How shards run the Keras `optimizer`; ConfigError if towerps cannot run it."""
    import keras

    serialized = keras.optimizers.serialize(optimizer)
    name, config = serialized["class_name"], dict(serialized["config"])
    _check_supported(name, config, optimizer)
    clip = config.pop("global_clipnorm", None)
    fast = _fast_path(name, config)
    if fast is not None:
        return OptimizerSpec(name=fast[0], lr=fast[1], hyper=fast[2], global_clipnorm=clip)
    whole = name not in ELEMENTWISE or bool(config.get("clipnorm"))
    keras_config = {**serialized, "config": {**config, "global_clipnorm": None}}
    # exclude_from_weight_decay(var_names=...) is not part of get_config: carry its pattern.
    pattern = getattr(optimizer, "_exclude_from_weight_decay_pattern", None)
    return OptimizerSpec(name=name, keras_config=keras_config, whole_variables=whole,
                         global_clipnorm=clip,
                         exclude_from_weight_decay=pattern.pattern if pattern else None)


def _check_supported(name: str, config: dict, optimizer) -> None:
    listed = f"supported: {', '.join(SUPPORTED)}"
    if name in REFUSED:
        raise ConfigError(f"optimizer {name} cannot run on parameter-server shards: "
                          f"{REFUSED[name]}; {listed}")
    builtin = type(optimizer).__module__.startswith("keras.")
    if builtin and name not in SUPPORTED:
        raise ConfigError(f"optimizer {name} is not supported on parameter-server shards; {listed}")
    if config.get("use_ema"):
        raise ConfigError(f"optimizer {name} with use_ema=True: the moving average would stay "
                          "on the shards, not in the model; drop use_ema")
    if getattr(optimizer, "_exclude_from_weight_decay", None):
        raise ConfigError(f"optimizer {name}: exclude_from_weight_decay(var_list=...) names "
                          "variable objects, which shards do not hold; use var_names=[...]")
    if config.get("loss_scale_factor"):
        raise ConfigError(f"optimizer {name} with loss_scale_factor: towerps trains in float32 "
                          "and never scales the loss; drop loss_scale_factor")


def _fast_path(name: str, config: dict):
    """(numpy name, lr, hyperparameters) when ps/optimizers.py does exactly this update."""
    lr = config.get("learning_rate")
    extras = ("weight_decay", "clipnorm", "clipvalue", "gradient_accumulation_steps")
    if not isinstance(lr, (int, float)) or any(config.get(k) for k in extras):
        return None
    if name == "SGD" and not config.get("nesterov"):
        momentum = float(config.get("momentum") or 0.0)
        return ("momentum", lr, (("momentum", momentum),)) if momentum else ("sgd", lr, ())
    if name == "Adam" and not config.get("amsgrad"):
        return "adam", lr, tuple((k, float(config[k])) for k in ("beta_1", "beta_2", "epsilon"))
    if name == "Adagrad":
        return "adagrad", lr, tuple((k, float(config[k]))
                                    for k in ("initial_accumulator_value", "epsilon"))
    return None


def check_table_optimizer(spec: OptimizerSpec, table_optimizer: str) -> None:
    """ConfigError when `table_optimizer` is "lazy" and `spec` runs Keras' own
    optimizer, which updates whole variables only."""
    if table_optimizer == "lazy" and spec.runs_keras:
        raise ConfigError(
            f"--table-optimizer lazy updates a table's touched rows alone, which the numpy "
            f"optimizers do (Keras SGD, SGD with momentum, Adam, Adagrad with a constant "
            f"learning rate and no weight decay, clipnorm, clipvalue or gradient "
            f"accumulation); the model's {spec.name} runs as Keras' own, which updates whole "
            f"variables: use one of those, or table_optimizer='exact'")


class KerasOptimizer(Optimizer):
    """Keras' own optimizer over a shard's numpy variables (imports TensorFlow).

    The numpy arrays stay the shard's truth: each `apply` copies them into
    Keras variables (named by the variables' short names, so AdamW's
    `exclude_from_weight_decay` patterns match), runs `apply_gradients`, and
    copies the result back. Its variables are built at the first `apply`,
    which must name every variable the shard holds (pushes always do).
    All or nothing, as the numpy optimizers: an update that would make a
    variable or one of the optimizer's own variables NaN or infinite raises
    NotFinite, its slots are put back from a copy taken before it, and the
    numpy arrays are never written.
    """

    def __init__(self, keras_config: dict, exclude_from_weight_decay: str | None = None,
                 tables: str = "exact"):
        import keras  # only shards running a Keras optimizer pay for TensorFlow

        super().__init__(lr=1.0)  # the rate lives in the Keras optimizer
        self.name = keras_config["class_name"]
        check_table_optimizer(OptimizerSpec(self.name, keras_config=keras_config), tables)
        # Named explicitly: Keras' deserialize does not know every class it ships (Lamb).
        shipped = getattr(keras.optimizers, self.name, None)
        custom = {self.name: shipped} if isinstance(shipped, type) else None
        self._optimizer = keras.optimizers.deserialize(keras_config, custom_objects=custom)
        if exclude_from_weight_decay:
            self._optimizer.exclude_from_weight_decay(var_names=[exclude_from_weight_decay])
        self._variables: dict = {}

    def apply(self, params, grads, lr_scale: float = 1.0) -> None:
        if lr_scale != 1.0:
            raise ConfigError(f"--staleness-lr scales the rate of numpy sgd/momentum/adam/adagrad only, "
                              f"not of Keras' {self.name}; drop --staleness-lr")
        checked = {name: _checked(name, params, g) for name, g in grads.items()}
        if not self._variables:
            self._build(params)
        elif set(checked) != set(self._variables):
            raise BadTensor(f"gradients for {sorted(checked)}, but this optimizer updates "
                            f"{sorted(self._variables)}")
        before = [np.array(v.numpy()) for v in self._optimizer.variables]  # slots, iterations
        for name in checked:
            self._variables[name].assign(params[name])
        self._optimizer.apply_gradients(
            [(checked[name], self._variables[name]) for name in checked])
        after = {name: self._variables[name].numpy() for name in checked}
        bad = [repr(n) for n, v in after.items() if not np.isfinite(v).all()] + [
            v.path for v in self._optimizer.variables if not np.isfinite(v.numpy()).all()]
        if bad:
            for variable, value in zip(self._optimizer.variables, before):
                variable.assign(value)
            raise NotFinite(f"{self.name} would make {', '.join(bad[:5])} NaN or infinite")
        for name in checked:
            params[name][...] = after[name]
        self.iterations += 1

    def _build(self, params) -> None:
        """Keras variables for every one of `params`, and the optimizer's slots (once)."""
        if self._variables:
            return
        import keras

        self._variables = {n: keras.Variable(params[n], name=short_name(n)) for n in params}
        self._optimizer.build(list(self._variables.values()))

    def state(self) -> dict[str, np.ndarray]:
        """The Keras optimizer's variables (iterations, slots), keyed "NNNN/name" by
        position: slot names repeat across variables with the same short name."""
        return {_state_key(i, v.path): np.array(v.numpy())
                for i, v in enumerate(self._optimizer.variables)}

    def load_state(self, state: dict[str, np.ndarray], params: dict | None = None) -> None:
        """Replace the optimizer's variables with those of `state()` output; `params`
        (the shard's variables) builds the slots first if no update has yet."""
        if params is not None:
            self._build(params)
        state = {_state_key(*key.split("/", 1)): value for key, value in state.items()}
        mine = self.state()
        if set(state) != set(mine):
            raise BadTensor(f"optimizer state holds {sorted(state)[:4]}..., this {self.name} "
                            f"holds {sorted(mine)[:4]}...; was it saved by another optimizer "
                            "or model?")
        for i, variable in enumerate(self._optimizer.variables):
            variable.assign(state[_state_key(i, variable.path)])
        self.iterations = int(self._optimizer.iterations.numpy())

    def keras_state(self) -> KerasState:
        """A copy of the optimizer's variables by attribute (`keras_variables`),
        slots keyed by this shard's variable names; empty before the first update."""
        if not self._variables:
            return KerasState({}, {})
        lists, scalars = keras_variables(self._optimizer)
        names = list(self._variables)  # the order the optimizer was built in
        slots = {attr: {names[i]: np.array(v.numpy()) for i, v in enumerate(slots)
                        if v is not None}
                 for attr, slots in lists.items()}
        return KerasState(slots, {a: np.array(v.numpy()) for a, v in scalars.items()})

    def __repr__(self) -> str:
        return f"KerasOptimizer({self.name}, iterations={self.iterations})"


# Lists a built optimizer holds that are not per-variable slots.
_NOT_SLOTS = ("_variables", "_trainable_variables")


def keras_variables(optimizer) -> tuple[dict[str, list], dict[str, object]]:
    """A built Keras optimizer's state by attribute: ({attribute: [slot of
    trainable variable i, or None]}, {attribute: Variable of its own}).

    Keras 3 keeps each kind of slot in a list aligned with the variables it
    was built on (Adam's `_momentums`, Adafactor's `_r`, Muon's
    `adam_velocities`) and its counters in attributes (`_iterations`, Nadam's
    `_u_product`); reading them by attribute rather than by the position in
    `optimizer.variables` names each slot's variable whatever the order in
    which an optimizer creates them (RMSprop makes every velocity first).
    """
    import keras

    count = len(optimizer._trainable_variables)
    lists, scalars = {}, {}
    for attr, value in vars(optimizer).items():
        if isinstance(value, keras.Variable):
            scalars[attr] = value
        elif (attr not in _NOT_SLOTS and isinstance(value, list) and len(value) == count
              and count and all(v is None or isinstance(v, keras.Variable) for v in value)):
            lists[attr] = value
    return lists, scalars


def assign_keras_state(optimizer, key_of, state: KerasState) -> None:
    """Load `state` (slots keyed by whole variables) into `optimizer`, which
    must be built on the model's trainable variables; `key_of(variable)` is a
    variable's key (ModelVariables.key_of). Slots the state lacks keep their
    values (a variable never updated has zero slots). Raises BadTensor if the
    state names an attribute this optimizer does not have (another optimizer).
    """
    if not optimizer.built:
        raise BadTensor(f"optimizer {type(optimizer).__name__} is not built: build it on the "
                        "model's trainable variables (optimizer.build(...)) first")
    lists, scalars = keras_variables(optimizer)
    unknown = sorted(set(state.slots) - set(lists)) + sorted(set(state.scalars) - set(scalars))
    if unknown:
        raise BadTensor(f"optimizer state has {unknown}, which {type(optimizer).__name__} does "
                        f"not keep (it keeps {sorted(lists)} and {sorted(scalars)}); was it "
                        "trained with another optimizer?")
    for attr, by_key in state.slots.items():
        for variable, slot in zip(optimizer._trainable_variables, lists[attr]):
            value = by_key.get(key_of(variable))
            if slot is not None and value is not None:
                slot.assign(value)
    for attr, value in state.scalars.items():
        scalars[attr].assign(value)


def _checked(name, params, grad) -> np.ndarray:
    if name not in params:
        raise BadTensor(f"gradient for unknown variable {name!r}")
    if isinstance(grad, RowSparse):  # Keras updates the whole table: "exact"
        if grad.shape != params[name].shape:
            raise BadTensor(f"gradient {name!r} has shape {grad.shape}, variable has "
                            f"{params[name].shape}")
        grad = grad.to_dense()
    grad = np.asarray(grad, dtype=np.float32)
    if grad.shape != params[name].shape:
        raise BadTensor(f"gradient {name!r} has shape {grad.shape}, variable has "
                        f"{params[name].shape}")
    return grad


def _state_key(position, path: str) -> str:
    """"NNNN/name" of an optimizer variable: its path without the optimizer's
    own name, which Keras numbers per process ("adam_w_1/kernel_momentum" is
    the second AdamW made there), so a restored shard's differs from the saver's.
    A variable made without a name (Nadam's `_u_product`) is numbered per
    process too ("variable_3"): it is "variable" here."""
    name = path.partition('/')[2] or path
    return f"{int(position):04d}/{_UNNAMED.sub('variable', name)}"


_UNNAMED = re.compile(r"^variable_\d+$")


def short_name(key: str) -> str:
    """A variable key's short name: "0003/kernel" or its slice "0003/kernel:1" -> "kernel"."""
    return key.partition("/")[2].partition(":")[0] or key
