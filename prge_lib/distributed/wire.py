"""The collective calls of a data-parallel run, each counted as it is made (chapter 11).

Every byte a worker hands to a collective passes through :class:`Wire`, which adds the tensor's size to a tally
named by the caller ("step", "check", …) before calling ``torch.distributed``. ``bytes_per_step`` is then a
measurement of what the calls sent, not a formula: the payload one worker puts on the wire per call (a ring
all-reduce moves about 2(N−1)/N times that per worker; both sides of every comparison are counted the same way).
"""
from __future__ import annotations

import datetime
import os
import socket
from collections import defaultdict

import torch
import torch.distributed as dist

BACKENDS = {"cpu": "gloo", "cuda": "nccl"}      # the backend for the device the workers train on


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (bound to 127.0.0.1 only, then released for the rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def backend_for(device: str) -> str:
    """gloo on the CPU, NCCL on GPUs; a ValueError naming the device otherwise."""
    kind = device.split(":")[0]
    if kind not in BACKENDS:
        raise ValueError(f"device {device!r} has no collective backend here; choose one of {list(BACKENDS)}")
    return BACKENDS[kind]


def init_from_env(device: str, timeout_s: float = 1800.0) -> tuple[int, int]:
    """Join the process group the launcher described in the environment (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT, as ``torch.distributed.run`` sets them); returns (rank, world size). A collective gives up after
    ``timeout_s`` (torch's default, 30 min: the other workers wait in the next step while rank 0 evaluates,
    which on the full protocol's 1000 test examples takes minutes on a CPU)."""
    if not dist.is_initialized():
        dist.init_process_group(backend_for(device), timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def worker_device(device: str) -> str:
    """This worker's device: the CPU, or the GPU of its local rank."""
    if device.split(":")[0] == "cuda":
        return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return device


class Wire:
    """Counted collectives over the default process group (see the module docstring)."""

    def __init__(self):
        self.sent: dict[str, int] = defaultdict(int)       # bytes handed to collectives, per tally
        self.calls: dict[str, int] = defaultdict(int)

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def size(self) -> int:
        return dist.get_world_size()

    def count(self, tally: str, tensor: torch.Tensor) -> None:
        self.sent[tally] += tensor.numel() * tensor.element_size()
        self.calls[tally] += 1

    def all_reduce(self, tensor: torch.Tensor, tally: str = "step") -> torch.Tensor:
        """Sum ``tensor`` over the workers, in place."""
        self.count(tally, tensor)
        dist.all_reduce(tensor)
        return tensor

    def all_gather(self, tensor: torch.Tensor, tally: str = "check") -> list[torch.Tensor]:
        """Every worker's ``tensor``, in rank order."""
        self.count(tally, tensor)
        out = [torch.empty_like(tensor) for _ in range(self.size)]
        dist.all_gather(out, tensor)
        return out

    def report(self, steps: int) -> dict:
        """The tallies as a result's ``communication`` block: bytes and calls per tally, and bytes per step."""
        return {"bytes_per_step": self.sent["step"] / steps if steps else None,
                "bytes": dict(self.sent), "calls": dict(self.calls), "workers": self.size,
                "counted": "payload bytes one worker hands to each collective call"}
