"""Start the workers of a data-parallel run with PyTorch's own launcher (``torch.distributed.run``, elastic;
chapter 11): N processes on this machine, rendezvous on 127.0.0.1 at a free port, each running the same ``prge``
command, which sees the launcher's environment and trains as one worker."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from prge_lib.distributed.wire import free_port


def is_worker() -> bool:
    """Whether this process was started by ``torch.distributed.run`` (it sets the worker's ranks)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def launch_command(argv: Sequence[str], workers: int, port: int | None = None) -> list[str]:
    """The launcher's command line for ``prge <argv>`` in ``workers`` processes."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(workers),
            "--master-addr", "127.0.0.1", "--master-port", str(port or free_port()), "--max-restarts", "0",
            "-m", "prge_lib.cli.main", *argv]


def launch(argv: Sequence[str], workers: int, timeout_s: float | None = None) -> int:
    """Run ``prge <argv>`` as ``workers`` workers; the launcher's exit status (0: every worker finished). Gloo
    talks over the loopback interface unless ``GLOO_SOCKET_IFNAME`` says otherwise."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    env.setdefault("OMP_NUM_THREADS", "1")
    # the workers import the library this process runs
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run(launch_command(argv, workers), env=env, timeout=timeout_s).returncode
