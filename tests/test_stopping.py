"""prge_lib.training.stopping: the first signal asks for a stop, the second does what the signal does."""
import os
import signal
import time

import pytest

from prge_lib.experiments import reproduce as rp
from prge_lib.experiments import runner
from prge_lib.training import stopping


def test_the_first_signal_asks_for_a_stop_and_the_second_acts_as_the_signal():
    before = signal.getsignal(signal.SIGINT)
    said = []
    assert not stopping.past(None) and stopping.past(time.time() - 1) and stopping.reason() == "the time limit"
    with pytest.raises(KeyboardInterrupt):
        with stopping.stop_on_signals(say=said.append):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)                    # the handler runs between bytecodes of the main thread
            assert stopping.asked() == "SIGINT" and stopping.past(None) and stopping.reason() == "SIGINT"
            assert len(said) == 1 and said[0].startswith("SIGINT: stopping after the current step")
            zero_shot = rp.grid_cells("table1", "cpu", only="sst2/zeroshot")[0]
            assert not runner._fits_before(zero_shot, None)        # no further cell starts, whatever its kind
            os.kill(os.getpid(), signal.SIGINT)  # the second: Python's own handler, a KeyboardInterrupt
            time.sleep(0.01)
    assert signal.getsignal(signal.SIGINT) is before and stopping.asked() is None and not stopping.past(None)


def test_the_grid_says_a_signal_kept_its_cells_from_starting(monkeypatch, tmp_path):
    said = []
    monkeypatch.setattr(stopping, "_asked", ["SIGTERM"])
    cells = rp.grid_cells("table1", "cpu", only="sst2/zeroshot")
    assert rp.run_grid(cells, results=tmp_path, checkpoints=tmp_path, progress=False, say=said.append) == []
    assert said[-1] == "stop asked by SIGTERM: 1 cells not run; the same command continues"


def test_a_loss_risen_past_the_factor_over_whole_windows_stops_a_run(monkeypatch):
    window = stopping.LOSS_WINDOW
    start, risen = [6.0] * window, [6.0] * window + [20.0] * window          # 20 / 6 = 3.33 times the start
    assert stopping.loss_rise(risen, None) is None                            # no factor: never
    assert stopping.loss_rise(risen[:-1], 3.0) is None                        # not yet two whole windows
    assert stopping.loss_rise(risen, 3.5) is None and stopping.loss_rise(start + start, 1.01) is None
    assert stopping.loss_rise(risen, 3.0) == (
        f"the mean training loss of steps {window + 1}-{2 * window} is 20, 3.33 times that of steps 1-{window} (6), "
        f"above the --stop-rising factor 3")
    spike = [6.0] * (2 * window - 1) + [30.0]                 # one step at 5 times the start: not the window's mean
    assert stopping.loss_rise(spike, 3.0) is None
    monkeypatch.setattr(stopping, "LOSS_WINDOW", 2)                            # read when called
    assert stopping.loss_rise([1.0, 1.0, 5.0, 5.0], 3.0).startswith("the mean training loss of steps 3-4 is 5,")
