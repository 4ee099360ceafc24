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
