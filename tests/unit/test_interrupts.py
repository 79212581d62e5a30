"""What a signal does to a run, by phase (no Ray: the handler itself)."""

import signal
import threading

import pytest

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


def test_exit_status_follows_the_shell():
    assert (exit_status(signal.SIGINT), exit_status(signal.SIGTERM)) == (130, 143)
