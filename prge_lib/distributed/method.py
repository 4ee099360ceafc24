"""The data-parallel P-RGE step (chapter 11): the q queries of a step split over N workers, q projected gradients
exchanged, the same update applied everywhere.

Gao et al. Alg. 1 with queries i = 1 … q on a batch of b rows. Worker k of N forwards the copies (s_i, ±ε) of its
queries Q_k = {i : i mod N = k} on the same b rows (every worker holds the batch: the data order is a pure
function of (seed, step)) and fills one message of q + 1 floats:

    m_k[i] = g_i = (ℓ⁺_i − ℓ⁻_i) / 2ε   for i ∈ Q_k,   0 for the other queries          (Alg. 1 line 11)
    m_k[q] = Σ_{i∈Q_k} (ℓ⁺_i + ℓ⁻_i)                                                    (for the loss record)

One all-reduce sums the messages: m = Σ_k m_k holds every g_i exactly (each entry is one worker's value plus
zeros) and the summed losses. Every worker then applies B ← B − (η/q) Σ_i g_i z_i (Alg. 1 line 14,
:func:`prge_lib.zo.prge.apply_update`), drawing z_i from s_i itself: no parameter or gradient tensor is sent,
only 4(q + 1) bytes a step.
"""
from __future__ import annotations

import contextlib

import torch

from prge_lib.distributed.wire import Wire
from prge_lib.zo.estimator import step_seeds
from prge_lib.zo.lora import draw_noise, keeping_noise
from prge_lib.zo.prge import PRGE, apply_update, two_point_losses


def shard(q: int, rank: int, workers: int) -> list[int]:
    """The queries worker ``rank`` of ``workers`` forwards: i mod N = rank."""
    return list(range(rank, q, workers))


DATA_PARALLEL = ("prge", "mezo-lorafa")       # the methods whose steps are seeds plus q projected gradients


def check_data_parallel(config, workers: int) -> None:
    """Refuse a run that cannot train data-parallel (another method, a program, fewer queries than workers),
    naming the setting; ``config`` is resolved."""
    if config.method not in DATA_PARALLEL:
        raise ValueError(f"--workers trains {' or '.join(DATA_PARALLEL)}, not {config.method}")
    if config.program is not None:
        raise ValueError("--workers trains eager P-RGE; a --program runs in the runtime host (prge device-train)")
    if config.engine != "layerwise" or config.buckets:
        raise ValueError(f"--workers splits the layerwise P-RGE step over the workers; engine {config.engine!r} "
                         f"and --buckets are single-process options (use --engine layerwise, no --buckets)")
    if config.q < workers and config.method == "mezo-lorafa":
        raise ValueError(f"--workers {workers}: mezo-lorafa has one query a step, which one worker forwards; use "
                         f"--method prge with q ≥ {workers}")
    check_workers(config.q, workers)


def check_workers(q: int, workers: int) -> None:
    """Refuse more workers than queries (a worker without a query would only wait), naming both."""
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    if workers > q:
        raise ValueError(f"--workers {workers} with q = {q}: each worker forwards at least one query, so use at "
                         f"most {q} workers or raise --q")


class DataParallelPRGE:
    """A built :class:`~prge_lib.zo.prge.PRGE` whose steps run split over the workers of ``wire`` (see the
    module docstring); everything else (model, trainable tensors, settings) is the wrapped method's."""

    optimizer = None

    def __init__(self, method: PRGE, wire: Wire):
        if not isinstance(method, PRGE):
            raise ValueError(f"data-parallel training runs P-RGE on LoRA-FA (prge, mezo-lorafa), not "
                             f"{type(method).__name__}")
        check_workers(method.q, wire.size)
        self.inner, self.wire = method, wire
        self.model, self.layers = method.model, method.layers
        self.mine = shard(method.q, wire.rank, wire.size)
        self.device = next(method.model.parameters()).device
        self.settings = {**method.settings, "workers": wire.size,
                         "queries_by_rank": [shard(method.q, k, wire.size) for k in range(wire.size)]}
        self.times: dict[str, float] = {}
        self.start: dict = {}

    def trainable(self) -> dict[str, torch.Tensor]:
        return self.inner.trainable()

    @torch.no_grad()
    def step(self, batch, t: int) -> dict:
        m = self.inner
        seeds = step_seeds(m.seed, t, m.q)
        kept = keeping_noise(m.layers, draw_noise(m.layers, seeds)) if m.keep_noise else contextlib.nullcontext()
        with kept:
            losses, g, _ = two_point_losses(m.model, m.layers, batch, [seeds[i] for i in self.mine], m.eps,
                                            m.outer, m.inner)
            message = torch.zeros(m.q + 1, dtype=torch.float32)
            message[self.mine] = g
            message[m.q] = losses.sum()
            on_wire = message.to(self.device)     # NCCL sends tensors on the GPU, gloo on the CPU
            message = self.wire.all_reduce(on_wire, "step").cpu()
            finite = bool(torch.isfinite(message).all())
            if finite:
                apply_update(m.layers, seeds, message[:m.q], m.lr)
        return {"loss": float(message[m.q]) / (2 * m.q), "finite": finite,
                "projected_grad": message[:m.q].tolist()}
