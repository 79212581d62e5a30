"""What a run prints: towerps' own lines, and the start-up noise of others hidden.

    log_to_stderr(verbose=False)          # the CLI, once
    quiet_tensorflow(verbose=False)       # towerps.fit, at its start
    with quiet_native_stderr():           # around `import tensorflow`
        import tensorflow

By default a run shows towerps' lines, the progress bar and errors. TensorFlow
and absl write their start-up lines (oneDNN, CPU features, "All log messages
before absl::InitializeLog()") from C++ straight to file descriptor 2, past
`TF_CPP_MIN_LOG_LEVEL`, so `quiet_native_stderr` catches the descriptor itself
while TensorFlow loads and writes back every line that is not such noise.
Ray's own start-up lines go through its Python logger (`ray_logging_level`).
`--verbose` shows everything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator

# Lines TensorFlow and absl print while loading, whatever the log level.
_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\)"
    r"|I\d{4} [\d:. ]+\d+ \S+:\d+\]"  # absl/glog INFO lines: I0000 00:00:17.. 123 port.cc:153]
    r"|To enable the following instructions:)"
)


def is_noise(line: str) -> bool:
    """Whether a line of stderr is TensorFlow/absl start-up chatter."""
    return bool(_NOISE.match(line))


@contextlib.contextmanager
def quiet_native_stderr(enabled: bool = True) -> Iterator[None]:
    """Hold file descriptor 2 in a temporary file for the block, then write back
    the lines that are not start-up noise (an import error's text survives).

    Not for long blocks: another thread's stderr is delayed until the end.
    """
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode(errors="replace")
            kept = [line for line in text.splitlines(keepends=True) if not is_noise(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def import_tensorflow(verbose: bool) -> None:
    """Import TensorFlow and Keras now, quietly unless `verbose`."""
    with quiet_native_stderr(not verbose):
        import keras  # noqa: F401
        import tensorflow  # noqa: F401


def quiet_tensorflow(verbose: bool) -> None:
    """An entry point's TensorFlow as quiet as the CLI's (towerps.fit): its
    C++ logs above INFO unless `verbose` (unless the user chose a level),
    and imported now, its start-up lines held back."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "2")
    import_tensorflow(verbose)


def quiet_ray_data(datasets, verbose: bool) -> None:
    """Ray Data's progress off the console unless `verbose`: no progress bars
    and no start-of-execution lines for `datasets` (each Dataset keeps the
    DataContext it was made with, so setting the current one is not enough)
    nor for Ray Data in this process, and its INFO lines only in its log
    file (ray-data.log in the Ray session's logs folder); the progress lines
    of its SplitCoordinator actor, which Ray forwards here, are dropped too
    (`CoordinatorLines`)."""
    CoordinatorLines.install(quiet=not verbose)
    if verbose:
        return
    from ray.data import DataContext

    for context in [DataContext.get_current(), *(d.context for d in datasets)]:
        context.enable_progress_bars = False
        context.print_on_execution_start = False
    for handler in logging.getLogger("ray.data").handlers:
        if isinstance(handler, logging.StreamHandler):  # the console; not its file
            handler.setLevel(logging.WARNING)
            if _progress_note not in handler.filters:
                handler.addFilter(_progress_note)


class CoordinatorLines:
    """Drops Ray Data's SplitCoordinator progress lines from the console.

    `streaming_split` runs the split's executor in a SplitCoordinator actor
    on the driver's node. Its process logs Ray Data's progress (that its
    progress bars are off, each epoch's "Dataset ... execution finished in
    N seconds") to its own console, at Ray Data's default levels, and Ray
    forwards every actor's console to the driver's. Those lines are dropped
    here as they arrive, unless --verbose; the coordinator's log files
    (ray-data.log and the actor's worker-*.err in the Ray session's logs
    folder) keep them, and its other lines (a warning that a split waits
    for the others) still show. Ray offers no setting for another process's
    console, so this wraps the driver's dispatcher of forwarded lines (a
    Ray internal: with a Ray that has none, the lines show as before).
    """

    ACTOR = "SplitCoordinator"
    NOISE = re.compile(r"Progress bars disabled|Dataset \S+ execution finished in"
                       r"|Starting execution of Dataset|Execution plan of Dataset"
                       r"|registers for logging while another dataset")
    quiet = False  # the latest choice (install); one wrapper per process

    @classmethod
    def install(cls, quiet: bool) -> None:
        """Drop the lines (`quiet`) or show them from now on."""
        cls.quiet = quiet
        try:
            from ray._private.ray_logging import global_worker_stdstream_dispatcher
        except ImportError:
            return
        emit = global_worker_stdstream_dispatcher.emit
        if quiet and not getattr(emit, "drops_coordinator_lines", False):
            def kept_only(data: dict) -> None:
                kept = cls.kept(data)
                if kept is not None:
                    emit(kept)

            kept_only.drops_coordinator_lines = True
            global_worker_stdstream_dispatcher.emit = kept_only

    @classmethod
    def kept(cls, data: dict) -> dict | None:
        """`data` (a batch of console lines Ray forwards from one worker
        process: "actor_name", "lines", ...) without the coordinator's
        progress lines while quiet; None when none is left."""
        if not cls.quiet or data.get("actor_name") != cls.ACTOR:
            return data
        lines = [line for line in data.get("lines", []) if not cls.NOISE.search(line)]
        return {**data, "lines": lines} if lines else None


def _progress_note(record: logging.LogRecord) -> bool:
    """False for Ray Data's warning that its progress bars are off (we turned them off)."""
    return not record.getMessage().startswith("Progress bars disabled")


def ray_logging_level(verbose: bool) -> int:
    """`ray.init(logging_level=...)`: Ray's start-up lines only with --verbose."""
    return logging.INFO if verbose else logging.ERROR


def actor_env(verbose: bool) -> dict[str, str]:
    """Environment of every actor: TensorFlow's C++ logs above INFO unless verbose."""
    return {"TF_CPP_MIN_LOG_LEVEL": "0" if verbose else "2"}


def log_to_stderr(verbose: bool = False) -> None:
    """towerps' own log lines (where shards and workers landed) on stderr, once;
    with `verbose`, also debug lines. Quiets TensorFlow's C++ logs in this process."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "2")
    log = logging.getLogger("towerps")
    if not log.handlers:  # main() may run more than once in a process (tests)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("towerps: %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.DEBUG if verbose else logging.INFO)
