"""A worker's towers: model replicas on several devices, one gradient out.

    group = TowerGroup.build(lambda: build_model("mlp", (28, 28, 1), 10, seed=0),
                             ["/GPU:0", "/GPU:1", "/CPU:0"], balance="measured")
    group.set_weights(params)                   # every replica
    grads, loss = group.compute_gradients(x, y) # one gradient for the worker

A TowerGroup has the interface of a `Tower`, so the worker loop neither knows
nor cares how many devices compute its gradient, and makes ONE push per shard
per step whatever the number of towers: aggregation is node-local and network
traffic does not grow with the GPUs of a node.

One step: the worker's rows are cut into contiguous parts, one per tower, by
the current shares; each tower computes the mean-loss gradient of its part on
its own device, all at once in threads (TensorFlow releases the GIL while a
function runs, so the devices overlap); the CPU then averages the towers'
gradients weighted by their example counts. That is exactly the gradient of
all the rows, so parity with one tower holds up to floating point, for any
shares.

Balancing: `equal` splits the rows evenly. `measured` times every tower
(wall time of its part, in its own thread) and, after `warmup_steps` and then
every `rebalance_every` steps, sets the shares in proportion to each tower's
examples/s over the last `window_steps` steps, so a slow CPU tower gets fewer
rows instead of making the GPU towers wait. Every tower keeps at least one
row, so it stays measured.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures

import keras
import numpy as np
import tensorflow as tf

from towerps.errors import ConfigError
from towerps.sparse import RowSparse
from towerps.workers.batches import num_examples, take
from towerps.workers.devices import BALANCES
from towerps.workers.tower import Tower


class TowerGroup:
    """Several Towers behind one Tower interface. Not thread-safe: one step at a time."""

    def __init__(
        self,
        towers: Sequence[Tower],
        balance: str = "equal",
        *,
        warmup_steps: int = 2,
        window_steps: int = 5,
        rebalance_every: int = 50,
    ):
        if not towers:
            raise ConfigError("a TowerGroup needs at least one tower; got zero")
        if balance not in BALANCES:
            raise ConfigError(f"balance {balance!r} is not known; choose one of {', '.join(BALANCES)}")
        names = [t.variable_names for t in towers]
        if any(n != names[0] for n in names):
            raise ConfigError("every tower of a group must hold the same model (variable names differ)")
        self.towers = list(towers)
        self.balance = balance
        self._warmup, self._window, self._every = warmup_steps, window_steps, rebalance_every
        self._weights = np.full(len(self.towers), 1.0 / len(self.towers))  # shares, sum 1
        self._rows = [0] * len(self.towers)  # rows of the last step, per tower
        self._timings: deque[tuple[list[int], list[float]]] = deque(maxlen=window_steps)
        self._steps = 0
        self._pool = futures.ThreadPoolExecutor(len(self.towers), thread_name_prefix="tower")

    @classmethod
    def build(cls, make_model: Callable[[], keras.Model], devices: Sequence[str],
              balance: str = "equal", wrap: Callable[[list], list] | None = None,
              loss=None, **kwargs) -> TowerGroup:
        """One replica per device, each built there, so its variables live on it.

        `wrap`, when given, receives the replicas and returns those to group:
        where tests install a slow device (towerps.testing). `loss`: for a
        model compiled without one (Tower's `loss`).
        """
        towers = []
        for device in devices:
            with tf.device(device):
                towers.append(Tower(make_model(), device=device, loss=loss))
        return cls(wrap(towers) if wrap else towers, balance, **kwargs)

    # -- the Tower interface ---------------------------------------------

    @property
    def device(self) -> str:
        return ",".join(self.devices)

    @property
    def variable_names(self) -> list[str]:
        return self.towers[0].variable_names

    @property
    def trainable_names(self) -> list[str]:
        return self.towers[0].trainable_names

    @property
    def state_names(self) -> list[str]:
        return self.towers[0].state_names

    def variable_bytes(self) -> dict[str, int]:
        return self.towers[0].variable_bytes()

    def get_weights(self) -> dict[str, np.ndarray]:
        return self.towers[0].get_weights()

    def set_weights(self, params: Mapping[str, np.ndarray], adopt: bool = False) -> None:
        """Assign `params` to every replica (concurrently: one copy per device).
        `adopt` (Tower.set_weights) holds for a lone tower only: replicas
        must not share their variables' memory."""
        if len(self.towers) == 1:
            self.towers[0].set_weights(params, adopt)
            return
        self._map(lambda tower: tower.set_weights(params), self.towers)

    @property
    def has_tables(self) -> bool:
        return self.towers[0].has_tables

    def row_ids(self, x) -> dict[str, np.ndarray] | None:
        """The rows of each table `x` looks up (Tower.row_ids): every replica's model is alike."""
        return self.towers[0].row_ids(x)

    def compute_gradients(self, x: np.ndarray, y: np.ndarray) -> tuple[dict[str, np.ndarray], float]:
        """The gradient of the mean loss over all of (x, y), and that loss.

        x, y: arrays or nests of arrays with n examples each, n >= number of towers.
        Gradients of trainable variables and new values of float state
        (Tower.compute_gradients) both combine as the example-weighted mean.
        Blocks until every tower is done.
        """
        bounds = self._bounds(num_examples(x))
        parts = [(t, *take((x, y), lo, hi)) for t, (lo, hi) in zip(self.towers, bounds)]
        # The first step traces every tower's tf.function: one at a time, as
        # Keras' tracing state is not meant to be shared across threads.
        results = self._map(self._timed, parts, parallel=self._steps > 0)
        self._rows = [hi - lo for lo, hi in bounds]
        self._steps += 1
        if self.balance == "measured" and self._steps > self._warmup:
            self._timings.append((self._rows, [seconds for _, _, seconds in results]))
            since = self._steps - self._warmup
            if since == self._window or (since > self._window and since % self._every == 0):
                self._rebalance()
        return _weighted_mean([(g, loss, n) for (g, loss, _), n in zip(results, self._rows)])

    # -- for the summary -------------------------------------------------

    @property
    def devices(self) -> list[str]:
        return [t.device for t in self.towers]

    @property
    def shares(self) -> list[float]:
        """Each tower's fraction of the worker's rows (sums to 1)."""
        return [float(w) for w in self._weights]

    def report(self) -> list[dict]:
        """Per tower: device, share, rows of the last step."""
        return [
            {"device": d, "share": s, "rows": r}
            for d, s, r in zip(self.devices, self.shares, self._rows)
        ]

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # -- internals -------------------------------------------------------

    def _map(self, fn, items, parallel: bool = True) -> list:
        if not parallel or len(self.towers) == 1:
            return [fn(item) for item in items]
        return [f.result() for f in [self._pool.submit(fn, item) for item in items]]

    def _timed(self, part) -> tuple[dict[str, np.ndarray], float, float]:
        tower, x, y = part
        t0 = time.perf_counter()
        grads, loss = tower.compute_gradients(x, y)
        return grads, loss, time.perf_counter() - t0

    def _bounds(self, n: int) -> list[tuple[int, int]]:
        """Contiguous [lo, hi) rows per tower, by the shares; each gets >= 1 row."""
        k = len(self.towers)
        if n < k:
            raise ConfigError(
                f"a worker's batch of {n} rows cannot feed its {k} towers; use a global "
                f"batch of at least {k} rows per worker"
            )
        # Largest remainder of the shares, then a row for any tower left with none.
        exact = self._weights * n
        rows = np.floor(exact).astype(int)
        for i in np.argsort(-(exact - rows), kind="stable")[: n - rows.sum()]:
            rows[i] += 1
        for i in np.flatnonzero(rows == 0):
            rows[np.argmax(rows)] -= 1
            rows[i] = 1
        edges = np.concatenate([[0], np.cumsum(rows)])
        return [(int(edges[i]), int(edges[i + 1])) for i in range(k)]

    def _rebalance(self) -> None:
        rows = np.sum([r for r, _ in self._timings], axis=0, dtype=np.float64)
        seconds = np.sum([s for _, s in self._timings], axis=0, dtype=np.float64)
        speed = rows / np.maximum(seconds, 1e-9)  # examples/s per tower
        self._weights = speed / speed.sum()


def _weighted_mean(results: list[tuple[dict[str, np.ndarray], float, int]]):
    """sum(n_i * g_i) / sum(n_i) per variable, in float32 on the CPU, and the same for losses.

    The shards weight pushes the same way, so splitting a batch over towers
    changes nothing but rounding. A row-sparse gradient stays row-sparse
    (`_weighted_rows`), equal to the dense mean bit for bit.
    """
    if len(results) == 1:
        return results[0][0], results[0][1]
    total = sum(n for _, _, n in results)
    grads = {}
    for name in results[0][0]:
        if isinstance(results[0][0][name], RowSparse):
            grads[name] = _weighted_rows([(g[name], n) for g, _, n in results], total)
            continue
        acc = np.zeros_like(results[0][0][name])
        for g, _, n in results:
            acc += np.float32(n) * g[name]
        acc *= np.float32(1.0 / total)
        grads[name] = acc
    loss = sum(loss * n for _, loss, n in results) / total
    return grads, float(loss)


def _weighted_rows(grads: list[tuple[RowSparse, int]], total: int) -> RowSparse:
    """`_weighted_mean` of row-sparse gradients, over the union of their ids.

    The same arithmetic as the dense sum, row by row: a dense sum would add
    n * 0 = +0.0 for a tower that did not touch a row, which changes
    nothing here (the sum starts at +0.0, so it is never -0.0), so leaving
    those rows out gives the dense mean's bits."""
    ids = functools.reduce(np.union1d, [g.ids for g, _ in grads])
    first = grads[0][0]
    acc = np.zeros((len(ids), *first.rows.shape[1:]), np.float32)
    for g, n in grads:
        acc[np.searchsorted(ids, g.ids)] += np.float32(n) * g.rows
    acc *= np.float32(1.0 / total)
    return RowSparse(ids.astype(np.int64, copy=False), acc, first.num_rows)
