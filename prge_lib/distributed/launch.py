"""Start the workers of a data-parallel run with PyTorch's own launcher (``torch.distributed.run``, elastic;
chapter 11): N processes on this machine, rendezvous on 127.0.0.1 at a free port, each running the same ``prge``
command, which sees the launcher's environment and trains as one worker."""
from __future__ import annotations

import contextlib
import os
import platform
import signal
from pathlib import Path
from typing import Sequence

from prge_lib.distributed.wire import free_port


# seconds the launcher waits, after passing a signal on, for the workers to finish their step and for rank 0 to
# write its checkpoint, before it kills them (torch's default is 30; a step of a large model on a CPU, or an
# evaluation under way when the signal came, takes longer: past this, the run resumes from its last checkpoint)
SHUTDOWN_WAIT_S = 600


def is_worker() -> bool:
    """Whether this process was started by ``torch.distributed.run`` (it sets the worker's ranks)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def launcher_options(argv: Sequence[str], workers: int, port: int | None = None) -> list[str]:
    """``torch.distributed.run``'s options for ``prge <argv>`` in ``workers`` processes on this machine."""
    return ["--nnodes", "1", "--nproc-per-node", str(workers), "--master-addr", "127.0.0.1",
            "--master-port", str(port or free_port()), "--max-restarts", "0", "-m", "prge_lib.cli.main", *argv]


def loopback() -> str:
    """The name of this machine's loopback interface, for gloo: ``lo0`` on macOS, ``lo`` elsewhere."""
    return "lo0" if platform.system() == "Darwin" else "lo"


@contextlib.contextmanager
def worker_environment():
    """The environment the workers inherit: gloo on the loopback interface (unless ``GLOO_SOCKET_IFNAME`` says
    otherwise), one thread each unless ``OMP_NUM_THREADS`` is set, and this library first on the path. The launcher
    itself waits ``SHUTDOWN_WAIT_S`` (unless ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` says otherwise) for workers it has
    passed a signal to before it kills them."""
    here = str(Path(__file__).resolve().parents[2])
    values = {"GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", loopback()),
              "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
              "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", str(SHUTDOWN_WAIT_S)),
              "PYTHONPATH": os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])])}
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def launch(argv: Sequence[str], workers: int) -> int:
    """Run ``prge <argv>`` as ``workers`` workers and return the command's exit status: 0 when every worker
    finished, else rank 0's status (the lowest failed rank's if rank 0 was stopped by the launcher), so a
    diverged run still exits with 3 and an interrupted one with 130. A signal to this process (Ctrl-C, a kill) is
    passed to every worker, which stop after the same step, rank 0 with a checkpoint (``--checkpoint-dir``); 130."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    options = get_args_parser().parse_args(launcher_options(argv, workers))
    with worker_environment(), own_signal_handlers():
        try:
            run(options)
        except ChildFailedError as err:
            own = {rank: f.exitcode for rank, f in err.failures.items() if f.exitcode > 0}   # not a signal
            return own.get(0) or (own[min(own)] if own else 1)
        except SignalException:         # the workers have had the signal and have stopped (rank 0 said where)
            return 130
    return 0


@contextlib.contextmanager
def own_signal_handlers():
    """Put back this process's handlers of the signals the launcher takes over (it leaves its own installed, and a
    later Ctrl-C in the same Python session, a notebook's, would raise its exception instead of
    KeyboardInterrupt)."""
    names = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
    saved = {s: signal.getsignal(s) for s in (getattr(signal, n) for n in names if hasattr(signal, n))}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
