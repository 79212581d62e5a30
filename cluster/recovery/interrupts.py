"""Clean stops: SIGINT (Ctrl-C), SIGTERM (a scheduler, `timeout`) and SIGHUP
(the terminal closed) end a run at a step.

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

A SIGTERM or SIGHUP within REPEAT_S of the first signal is the same request,
not a second one: `timeout` sends SIGTERM to the driver and then to its whole
process group, and a closing terminal's shell sends SIGHUP to its jobs' groups
as the kernel does to the foreground one. A second SIGINT stays what it
always was, a person's second Ctrl-C: saving is skipped.

SIGHUP is SIGTERM's twin (exit 129): the terminal is gone, so the driver's
stdout and stderr, when they were that terminal, are pointed at /dev/null
first (writing to a hung-up terminal fails, which would lose the saving);
the run's files say how it ended. A driver started with SIGHUP ignored
(`nohup towerps train ...`) keeps ignoring it and trains on.

The local Ray cluster's daemons run in a session of their own
(cluster/run/session.py), so a signal to the driver's process group reaches
the driver alone, and the run stops as above.

Ray installs its own SIGTERM handler in `ray.init` (it exits the process):
call `take_over()` after `ray.init` to put ours back. Off the main thread (a
notebook's worker thread) no handler can be installed; there the caller's
KeyboardInterrupt does the same as the first case. `exit_status` gives the
shell's convention: 128 + the signal's number (129 for SIGHUP, 130 for
SIGINT, 143 for SIGTERM).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
REPEATED = (signal.SIGTERM, signal.SIGHUP)  # sent more than once for one stop
REPEAT_S = 5.0  # a SIGTERM/SIGHUP this soon after the first signal repeats it


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
        self._first_at = 0.0  # time.monotonic() of the first signal
        self._phase = "start-up"
        self._raise_first = True
        self._previous: dict[int, object] = {}  # of the signals handled here

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    @property
    def handles(self) -> bool:
        """Whether `handling` installed handlers (this process's main thread owns it)."""
        return bool(self._previous)

    @property
    def signal_name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    def defer(self, phase: str = "training") -> None:
        """From now on a first signal only sets `requested` (the run ends at a step)."""
        self._phase, self._raise_first = phase, False

    def __call__(self, signum, frame) -> None:
        first = self.signum is None
        if first:
            self.signum, self._first_at = signum, time.monotonic()
            if signum == signal.SIGHUP:
                _leave_terminal()
            self.event.set()
        elif signum in REPEATED and time.monotonic() - self._first_at < REPEAT_S:
            return  # the same request again (see the module's docstring)
        if not first or self._raise_first:
            raise Interrupted(signum, self._phase if first else "shutdown")

    @contextlib.contextmanager
    def handling(self) -> Iterator[StopRequest]:
        """Handle SIGINT, SIGTERM and SIGHUP for the block (main thread only), then
        put the previous handlers back. SIGHUP ignored before (nohup) stays
        ignored."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        # SIGINT is ignored in a shell script's background jobs, where it
        # stopped runs before too; SIGHUP is ignored on purpose (nohup).
        self._previous = {s: signal.getsignal(s) for s in SIGNALS
                          if s != signal.SIGHUP or signal.getsignal(s) is not signal.SIG_IGN}
        self.take_over()
        try:
            yield self
        finally:
            for s, handler in self._previous.items():
                signal.signal(s, handler)

    def take_over(self) -> None:
        """(Re)install this handler for the signals `handling` took; ray.init
        replaces SIGTERM's."""
        if self._previous and threading.current_thread() is threading.main_thread():
            for s in self._previous:
                signal.signal(s, self)


def _leave_terminal() -> None:
    """Point stdout and stderr at /dev/null where they are a terminal (one that
    hung up: writing to it would raise EIO from here on)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                if os.isatty(fd):
                    os.dup2(devnull, fd)
    finally:
        os.close(devnull)
