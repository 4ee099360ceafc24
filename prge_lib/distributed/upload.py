"""A client's upload (chapter 11): the steps it trained, each as its q seeds and q projected gradients, and the
adapter another client rebuilds from it.

A client that trained steps t₀ … t₀ + k − 1 of a run (eagerly, or in an exported program on a device) sends
(run seed, q, t₀, [(s_t,1 … s_t,q), (g_t,1 … g_t,q)] for each step): 2kq numbers, whatever the adapter's size.
Whoever holds the run's config builds the method (A from the run seed, B₀ = 0, or the round's starting adapter),
checks that the seeds are the run's (``step_seeds``, so a message from another run or a shifted step is refused)
and replays the g (:func:`prge_lib.distributed.replay.replay`). The message is JSON: an fp32 g written as a
Python float is exact, so the replaying client applies the very numbers the trainer computed.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from prge_lib.distributed.replay import replay
from prge_lib.zo.estimator import step_seeds
from prge_lib.zo.prge import PRGE

UPLOAD_FORMAT = "prge-upload/1"


@dataclass(frozen=True)
class Upload:
    """Steps ``start`` … ``start + len(projected_grad) − 1`` of the run seeded ``run_seed``: per step the q seeds
    and the q projected gradients g_i = (ℓ⁺_i − ℓ⁻_i) / 2ε (Gao et al. Alg. 1 line 11)."""

    run_seed: int
    q: int
    start: int
    seeds: tuple[tuple[int, ...], ...]
    projected_grad: tuple[tuple[float, ...], ...]

    def __post_init__(self):
        if len(self.seeds) != len(self.projected_grad):
            raise ValueError(f"an upload has one seed list per step: {len(self.seeds)} seed lists for "
                             f"{len(self.projected_grad)} steps")
        for t, (seeds, g) in enumerate(zip(self.seeds, self.projected_grad), self.start):
            if len(seeds) != self.q or len(g) != self.q:
                raise ValueError(f"step {t}: {len(seeds)} seeds and {len(g)} projected gradients, q is {self.q}")
            bad = [x for x in g if not math.isfinite(x)]
            if bad:
                raise ValueError(f"step {t}: projected gradient {bad[0]} is not finite (a diverged step is "
                                 f"not applied, so it cannot be uploaded)")

    @property
    def steps(self) -> int:
        return len(self.projected_grad)

    def to_json(self) -> str:
        return json.dumps({"format": UPLOAD_FORMAT, "run_seed": self.run_seed, "q": self.q, "start": self.start,
                           "steps": [{"seeds": list(s), "g": list(g)}
                                     for s, g in zip(self.seeds, self.projected_grad)]})

    @classmethod
    def from_json(cls, text: str, source: str = "the upload") -> "Upload":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source} is not JSON ({e.msg} at line {e.lineno}); an upload is "
                             f"written by `prge device-train --upload`") from None
        if not isinstance(data, dict) or data.get("format") != UPLOAD_FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"{source} has format {found!r}; an upload has format {UPLOAD_FORMAT!r}")
        try:
            steps = data["steps"]
            return cls(int(data["run_seed"]), int(data["q"]), int(data["start"]),
                       tuple(tuple(int(s) for s in step["seeds"]) for step in steps),
                       tuple(tuple(float(x) for x in step["g"]) for step in steps))
        except KeyError as e:
            raise ValueError(f"{source} has no field {e.args[0]!r} (an upload has run_seed, q, start and steps, "
                             f"each step its seeds and g)") from None
        except (TypeError, ValueError) as e:
            raise ValueError(f"{source}: {e}") from None


def upload_of_run(result: dict, start: int = 0) -> Upload:
    """The upload of a P-RGE training result (the trainer's, or a device run's: both record ``projected_grad``
    per step and the resolved ``config``), whose first step is ``start``."""
    seed, q = result["config"]["seed"], result["config"]["q"]
    grads = result["projected_grad"]
    return Upload(seed, q, start, tuple(tuple(step_seeds(seed, t, q)) for t in range(start, start + len(grads))),
                  tuple(tuple(float(x) for x in g) for g in grads))


def check_upload(method: PRGE, upload: Upload) -> None:
    """Refuse an upload that is not from ``method``'s run: another run seed or q, or seeds that are not the
    run's seeds of those steps."""
    if (upload.run_seed, upload.q) != (method.seed, method.q):
        raise ValueError(f"the upload is from a run with seed {upload.run_seed} and q = {upload.q}; this client's "
                         f"run has seed {method.seed} and q = {method.q}")
    for t, seeds in enumerate(upload.seeds, upload.start):
        if list(seeds) != step_seeds(method.seed, t, method.q):
            raise ValueError(f"step {t}: the upload's seeds {list(seeds)} are not the run's seeds of that step "
                             f"{step_seeds(method.seed, t, method.q)}")


def replay_upload(method: PRGE, upload: Upload) -> PRGE:
    """Apply ``upload``'s steps to ``method``'s adapter (built for the run's config, holding the adapter of step
    ``upload.start``): the update of each step from its seeds and g alone. Returns ``method``."""
    check_upload(method, upload)
    return replay(method, upload.projected_grad, start=upload.start)


def upload_numbers(upload: Upload) -> int:
    """How many numbers the upload carries: a seed and a projected gradient per query and step."""
    return 2 * upload.q * upload.steps

