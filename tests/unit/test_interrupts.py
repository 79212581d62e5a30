"""What a signal does to a run, by phase (no Ray: the handler itself)."""

import signal
import threading

import pytest

from towerps.cluster.recovery import interrupts
from towerps.cluster.recovery.interrupts import Interrupted, StopRequest, exit_status

pytestmark = pytest.mark.unit


def test_during_start_up_a_signal_raises_at_once():
    stop = StopRequest()
    with stop.handling(), pytest.raises(Interrupted) as raised:
        signal.raise_signal(signal.SIGTERM)
    assert (raised.value.signum, raised.value.during) == (signal.SIGTERM, "start-up")
    assert stop.requested and stop.signal_name == "SIGTERM"


def test_during_training_the_first_signal_only_asks_and_a_second_raises():
    stop = StopRequest()
    with stop.handling():
        stop.defer("training")
        signal.raise_signal(signal.SIGINT)
        assert stop.requested and stop.signal_name == "SIGINT"
        with pytest.raises(Interrupted) as raised:
            signal.raise_signal(signal.SIGINT)
    assert raised.value.during == "shutdown"


def test_the_previous_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    with StopRequest().handling() as stop:
        assert signal.getsignal(signal.SIGTERM) is stop
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # what ray.init does
        stop.take_over()
        assert signal.getsignal(signal.SIGTERM) is stop
    assert signal.getsignal(signal.SIGTERM) is before


def test_off_the_main_thread_nothing_is_installed():
    seen = []

    def run():
        with StopRequest().handling():
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=10)
    assert seen == [signal.getsignal(signal.SIGINT)]


def test_a_sigterm_repeated_at_once_is_the_same_request_and_later_a_second(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(interrupts.time, "monotonic", lambda: now[0])
    stop = StopRequest()
    with stop.handling():
        stop.defer("training")
        signal.raise_signal(signal.SIGTERM)  # `timeout`: to the driver...
        now[0] += interrupts.REPEAT_S / 2
        signal.raise_signal(signal.SIGTERM)  # ...then to its group
        signal.raise_signal(signal.SIGHUP)
        assert stop.signal_name == "SIGTERM"
        now[0] += interrupts.REPEAT_S
        with pytest.raises(Interrupted) as raised:
            signal.raise_signal(signal.SIGTERM)
    assert raised.value.during == "shutdown"


def test_a_second_sigint_at_once_still_skips_saving(monkeypatch):
    monkeypatch.setattr(interrupts.time, "monotonic", lambda: 100.0)
    with StopRequest().handling() as stop:
        stop.defer("training")
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(Interrupted):
            signal.raise_signal(signal.SIGINT)


def test_an_ignored_sigint_is_handled_all_the_same():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a script's `towerps train &`
    try:
        with StopRequest().handling() as stop:
            assert signal.getsignal(signal.SIGINT) is stop
    finally:
        signal.signal(signal.SIGINT, before)


def test_sighup_stops_like_sigterm_unless_it_was_ignored():
    # As a terminal starts a command: SIGHUP at its default, whatever the
    # test run inherited (a suite started under nohup ignores it).
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        stop = StopRequest()
        with stop.handling():
            stop.defer("training")
            signal.raise_signal(signal.SIGHUP)
            assert stop.requested and stop.signal_name == "SIGHUP"
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
        with StopRequest().handling() as stop:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            stop.take_over()
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


def test_exit_status_follows_the_shell():
    assert (exit_status(signal.SIGHUP), exit_status(signal.SIGINT),
            exit_status(signal.SIGTERM)) == (129, 130, 143)
