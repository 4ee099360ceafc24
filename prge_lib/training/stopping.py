"""When a run stops before its last step: at a deadline (``prge reproduce --time-limit``) or when asked by a signal
(Ctrl-C, ``kill``). Either way it stops after a whole step, saves a checkpoint there and the same command resumes it
(chapter 7), so hours of steps are not lost to a session's end or a stray Ctrl-C. And, where asked
(``--stop-rising``), once its training loss has risen far above where it started (:func:`loss_rise`): such a run
is over, not paused, and is recorded as diverged, as one whose loss turned non-finite is.

:func:`stop_on_signals` turns the first SIGINT or SIGTERM into such a request; the loops that train
(``Trainer.run``, ``PackedTrainer.run``, the WikiText-2 curves) ask :func:`past` after each step, and a grid starts
no further cell once it is true. A second signal stops the process at once, as the signal would by itself.
"""
from __future__ import annotations

import signal
import statistics
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Sequence

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
LOSS_WINDOW = 50        # steps averaged at each end of a run's training loss (here, and in the sweeps' rules)
# words of the reason loss_rise gives, by which a summary tells a stop on a risen loss from one on a non-finite
# loss (summaries.diverged_at): result files already written carry them, so they stay as they are
ROSE_PAST = "above the --stop-rising factor"
_asked: list[str] = []          # the name of the signal that asked the runs to stop, while one has


def asked() -> str | None:
    """The signal that asked the runs to stop ("SIGTERM"), or None."""
    return _asked[0] if _asked else None


def past(deadline: float | None) -> bool:
    """Whether a run should stop after the step it just made: its ``deadline`` (a ``time.time()`` value) has
    passed, or a signal asked it to (:func:`stop_on_signals`)."""
    return bool(_asked) or (deadline is not None and time.time() >= deadline)


def reason() -> str:
    """What stopped a run early, in words: "SIGTERM" where a signal asked, else "the time limit"."""
    return asked() or "the time limit"


def _say(line: str) -> None:
    print(f"prge: {line}", file=sys.stderr, flush=True)


@contextmanager
def stop_on_signals(say: Callable[[str], None] = _say):
    """Within the block, the first SIGINT or SIGTERM asks the runs to stop after their current step with a
    checkpoint (:func:`past` turns true, ``say`` tells the user so); a second one restores the handler that was
    there and delivers the signal to it (Ctrl-C then raises KeyboardInterrupt, a kill ends the process). Outside
    the main thread, where Python cannot install handlers, the block runs without them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}

    def restore() -> None:
        for s, handler in previous.items():
            signal.signal(s, handler)

    def handler(signum, frame) -> None:
        name = signal.Signals(signum).name
        if _asked:                      # the second signal: do what it would have done without this block
            restore()
            signal.raise_signal(signum)
            return
        _asked.append(name)
        say(f"{name}: stopping after the current step with a checkpoint (the same command resumes); "
            f"send it again to stop at once")

    for s in STOP_SIGNALS:
        signal.signal(s, handler)
    try:
        yield
    finally:
        restore()
        _asked.clear()


def loss_rise(losses: Sequence[float], factor: float | None) -> str | None:
    """Why a run whose loss is still finite should stop as diverged (``--stop-rising factor``): it has made at least
    2·:data:`LOSS_WINDOW` steps and the mean of its last ``LOSS_WINDOW`` losses exceeds ``factor`` times the mean of
    its first (the means, not single steps: a ZO loss is noisy from step to step). None where it has not, or
    without ``factor``. A rate past a method's edge sits at several times its starting loss for the rest of its
    steps (chapter 8's random mask at lr 1e-1 on RTE: a mean of 2.7 over steps 1-50, 23 over steps 658-707), a rate
    that trains ends below its start."""
    window = LOSS_WINDOW
    if factor is None or len(losses) < 2 * window:
        return None
    first, last = statistics.fmean(losses[:window]), statistics.fmean(losses[-window:])
    if not last > factor * first:
        return None
    n = len(losses)
    return (f"the mean training loss of steps {n - window + 1}-{n} is {last:.4g}, {last / first:.3g} times that of "
            f"steps 1-{window} ({first:.4g}), {ROSE_PAST} {factor:g}")
