"""The fused P-RGE step replayed as a CUDA graph, one graph per batch shape (chapter 5).

The fused step (:mod:`prge_lib.zo.fused`) reads nothing on the host, so on a GPU its hundreds of kernel launches
can be recorded once and replayed: a graph fixes every tensor's address and shape, so the step reads its inputs
from fixed buffers (the batch, padded to a length bucket: :mod:`prge_lib.models.buckets`, and the q seeds as a
device tensor) and writes its losses and g to fixed outputs. Before each replay the step's batch and seeds are
copied into the buffers; the update of B happens inside the graph.

    capture   warm-up runs on a side stream, then one recorded run; every B is restored after them
    replay    copy batch and seeds in, replay, read the record (one copy to the host)

On the CPU (no graphs) the same buffered step runs eagerly, which is what the tests check: its numbers are the
fused step's.
"""
from __future__ import annotations

from typing import Sequence

import torch

from prge_lib.models.objective import IGNORE, Batch
from prge_lib.zo.fused import FusedPRGE, fused_prge_step, host_record
from prge_lib.zo.lora import LoRAFALinear
from prge_lib.zo.prge import step_seeds

WARMUP_RUNS = 3       # runs before a capture (lazy initialisation, kernel selection) on a side stream


@torch.no_grad()
def capture_graph(compute, state: Sequence[torch.Tensor]):
    """Record ``compute()`` as a CUDA graph: warm-up runs on a side stream, then one recorded run; the tensors of
    ``state`` (the B's the step updates) are restored after them. Returns the graph and the recorded outputs."""
    saved = [tensor.detach().clone() for tensor in state]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_RUNS):
            compute()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compute()
    for tensor, value in zip(state, saved):
        tensor.copy_(value)
    return graph, out


class BufferedStep:
    """The fused step of one batch shape (rows, length, target width), reading fixed buffers."""

    def __init__(self, method: "GraphedPRGE", rows: int, length: int, width: int):
        device = method.layers[0].lora_B.device
        self.method = method
        self.seeds = torch.zeros(method.q, dtype=torch.int64, device=device)
        self.batch = Batch(torch.zeros(rows, length, dtype=torch.long, device=device),
                           torch.ones(rows, length, dtype=torch.long, device=device),
                           torch.full((rows, width), IGNORE, dtype=torch.long, device=device))
        self.graph = None
        self.out: dict | None = None

    def load(self, batch: Batch, seeds: Sequence[int]) -> None:
        for buffer, value in zip((self.batch.input_ids, self.batch.attention_mask, self.batch.targets),
                                 (batch.input_ids, batch.attention_mask, batch.targets)):
            buffer.copy_(value, non_blocking=True)
        self.seeds.copy_(torch.tensor(list(seeds), dtype=torch.int64), non_blocking=True)

    def compute(self) -> dict:
        m = self.method
        return fused_prge_step(m.model, m.layers, self.batch, self.seeds, m.eps, m.lr, m.outer, m.inner,
                               device_mask=True)

    def capture(self) -> None:
        """Record the step as a CUDA graph (the B's are left as they were before)."""
        self.graph, self.out = capture_graph(self.compute, [layer.lora_B for layer in self.method.layers])

    def run(self) -> dict:
        if self.graph is None:
            return self.compute()
        self.graph.replay()
        return self.out


class GraphedPRGE(FusedPRGE):
    """:class:`prge_lib.zo.fused.FusedPRGE` whose step, on a GPU, is a CUDA graph per batch shape (captured at
    its first step of that shape); on the CPU the buffered step runs eagerly. Give it batches padded to a few
    lengths (``TrainConfig.buckets``): each new shape costs a capture."""

    def __init__(self, model, layers: Sequence[LoRAFALinear], q: int, eps: float, lr: float, seed: int = 0,
                 outer: bool = True, inner: bool = True):
        super().__init__(model, layers, q, eps, lr, seed, outer, inner)
        self.steps: dict[tuple[int, int, int], BufferedStep] = {}
        self.graphs = layers[0].lora_B.device.type == "cuda"

    def step(self, batch: Batch, t: int) -> dict:
        shape = (batch.rows, batch.input_ids.shape[1], batch.targets.shape[1])
        fresh = shape not in self.steps
        if fresh:
            self.steps[shape] = BufferedStep(self, *shape)
        buffered = self.steps[shape]
        buffered.load(batch, step_seeds(self.seed, t, self.q))
        if fresh and self.graphs:
            buffered.capture()
        return host_record(buffered.run())
