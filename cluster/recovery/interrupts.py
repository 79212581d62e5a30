"""Clean stops: SIGINT (Ctrl-C) and SIGTERM (a scheduler, `timeout`) end a run at a step.

    stop = StopRequest()
    with stop.handling():              # the driver's whole run; main thread only
        ...start-up...                 # a signal raises Interrupted: stop everything
        stop.defer()                   # training: a signal only sets stop.requested;
        ...                            #   the watch loop ends the run at the next step
        ...evaluate and save...        # a second signal raises Interrupted (skip saving)

What a signal does depends on when it lands:

  start-up   raises `Interrupted` where the driver is; the actors started so
             far and Ray are stopped on the way out; nothing is saved;
  training   (after `defer()`) asks the shards to end at their next version;
             the workers see it in their next pull; the run is then
             evaluated and saved as usual, its summary marked
             "stopped": "interrupted";
  a second   raises `Interrupted` at once: saving is skipped, actors and Ray
             are still stopped.

Ray installs its own SIGTERM handler in `ray.init` (it exits the process):
call `take_over()` after `ray.init` to put ours back. Off the main thread (a
notebook's worker thread) no handler can be installed; there the caller's
KeyboardInterrupt does the same as the first case. `exit_status` gives the
shell's convention: 128 + the signal's number (130 for SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """The run was stopped by a signal before it could be saved.

    A BaseException, like KeyboardInterrupt, so that no `except Exception`
    on the way up swallows it.
    """

    def __init__(self, signum: int, during: str):
        self.signum = signum
        self.during = during
        super().__init__(f"{signal.Signals(signum).name} during {during}")


def exit_status(signum: int) -> int:
    return 128 + signum


class StopRequest:
    """The signals received by a run, and what each one does now (see module doc)."""

    def __init__(self):
        self.signum: int | None = None  # the first signal received
        self.event = threading.Event()  # set by the first signal
        self._phase = "start-up"
        self._raise_first = True
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    @property
    def signal_name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def defer(self, phase: str = "training") -> None:
        """From now on a first signal only sets `requested` (the run ends at a step)."""
        self._phase, self._raise_first = phase, False

    def __call__(self, signum, frame) -> None:
        first = self.signum is None
        if first:
            self.signum = signum
            self.event.set()
        if not first or self._raise_first:
            raise Interrupted(signum, self._phase if first else "shutdown")

    @contextlib.contextmanager
    def handling(self) -> Iterator[StopRequest]:
        """Handle SIGINT and SIGTERM for the block (main thread only), then put the
        previous handlers back."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        self._previous = {s: signal.getsignal(s) for s in SIGNALS}
        self.take_over()
        try:
            yield self
        finally:
            for s, handler in self._previous.items():
                signal.signal(s, handler)

    def take_over(self) -> None:
        """(Re)install this handler for SIGINT and SIGTERM; ray.init replaces SIGTERM's."""
        if self._previous and threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                signal.signal(s, self)
