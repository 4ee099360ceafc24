"""A client's upload (chapter 11): the steps it trained, each as its seed index t and its q projected gradients, one
message in two encodings: bytes on the wire, whose length is the measured traffic, and JSON in a file.

A step's q seeds are ``step_seeds(run seed, t, q)`` (Gao et al. Alg. 1: a step is its seeds and its q values
g_t,i = (ℓ⁺ − ℓ⁻) / 2ε), so t and the g are all a step needs, whatever the adapter's size:

    wire   header (format 1 B, client 2 B, round 4 B, q 2 B, steps S 2 B), then per step: t (4 B, unsigned) and
           g_t,1 … g_t,q (4 B each, float32), little-endian                                    11 + S(4 + 4q) bytes
    file   {"format": "prge-upload/2", "run_seed", "client", "round", "q", "steps": [{"t", "g"}, …]}
    broadcast (the server's message after a round)  round 4 B, uploads C 2 B, then each upload as length 4 B + bytes

The wire form leaves the run seed out: the server and the clients of one federation share it. A file names it, so
whoever replays a file refuses one from another run. The g are the float32 values the step computed; 4 bytes or
a JSON number hold them exactly, so the replaying side applies the very numbers the client computed.
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Sequence

from prge_lib.zo.replay import replay_steps
from prge_lib.zo.estimator import step_seeds
from prge_lib.zo.prge import PRGE

WIRE_FORMAT = 1
FILE_FORMAT = "prge-upload/2"
_HEADER = struct.Struct("<BHIHH")
_ROUND = struct.Struct("<IH")
_LENGTH = struct.Struct("<I")


@dataclass(frozen=True)
class Upload:
    """One client's steps of one round: ``steps`` holds (seed index t, its q projected gradients). ``run_seed``:
    the run's seed, which a file carries and a wire message leaves to the federation (None)."""

    client: int
    round: int
    steps: tuple[tuple[int, tuple[float, ...]], ...]
    run_seed: int | None = None

    def __post_init__(self):
        if not self.steps:
            raise ValueError(f"client {self.client}, round {self.round}: an upload holds at least one step")
        for t, g in self.steps:
            if len(g) != self.q:
                raise ValueError(f"step {t}: {len(g)} projected gradients, but the upload's first step has "
                                 f"q = {self.q}")
            bad = [x for x in g if not math.isfinite(x)]
            if bad:
                raise ValueError(f"step {t}: projected gradient {bad[0]} is not finite (a diverged step is not "
                                 f"applied, so it cannot be uploaded)")

    @property
    def q(self) -> int:
        return len(self.steps[0][1])

    def seeds(self) -> list[list[int]]:
        """Each step's q seeds, from the run seed and the step's index t."""
        if self.run_seed is None:
            raise ValueError("a wire message does not carry the run seed; use the federation's")
        return [step_seeds(self.run_seed, t, self.q) for t, _ in self.steps]

    def numbers(self) -> int:
        """How many numbers the upload carries: a seed index per step and a projected gradient per query."""
        return len(self.steps) * (1 + self.q)

    # ----- the wire
    def to_bytes(self) -> bytes:
        step = struct.Struct(f"<I{self.q}f")
        return b"".join([_HEADER.pack(WIRE_FORMAT, self.client, self.round, self.q, len(self.steps)),
                         *(step.pack(t, *g) for t, g in self.steps)])

    @classmethod
    def from_bytes(cls, data: bytes, run_seed: int | None = None) -> "Upload":
        version, client, round_, q, count = _HEADER.unpack_from(data)
        if version != WIRE_FORMAT:
            raise ValueError(f"upload of wire format {version}; this library reads format {WIRE_FORMAT}")
        step = struct.Struct(f"<I{q}f")
        if len(data) != _HEADER.size + count * step.size:
            raise ValueError(f"upload of {len(data)} bytes; its header announces {count} steps of q = {q}")
        steps = tuple((t, tuple(g)) for t, *g in (step.unpack_from(data, _HEADER.size + k * step.size)
                                                   for k in range(count)))
        return cls(client, round_, steps, run_seed)

    # ----- a file
    def to_json(self) -> str:
        if self.run_seed is None:
            raise ValueError("an upload written to a file names its run seed (Upload(..., run_seed=))")
        return json.dumps({"format": FILE_FORMAT, "run_seed": self.run_seed, "client": self.client,
                           "round": self.round, "q": self.q,
                           "steps": [{"t": t, "g": list(g)} for t, g in self.steps]})

    @classmethod
    def from_json(cls, text: str, source: str = "the upload") -> "Upload":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source} is not JSON ({e.msg} at line {e.lineno}); an upload is "
                             f"written by `prge device-train --upload`") from None
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        if found != FILE_FORMAT:
            raise ValueError(f"{source} has format {found!r}; an upload has format {FILE_FORMAT!r}"
                             + (" (format 1, with each step's seeds, was written by an earlier version: write it "
                                "again with `prge device-train --upload`)" if found == "prge-upload/1" else ""))
        try:
            upload = cls(int(data["client"]), int(data["round"]),
                         tuple((int(step["t"]), tuple(float(x) for x in step["g"])) for step in data["steps"]),
                         int(data["run_seed"]))
        except KeyError as e:
            raise ValueError(f"{source} has no field {e.args[0]!r} (an upload has run_seed, client, round, q and "
                             f"steps, each step its t and g)") from None
        except (TypeError, ValueError, IndexError) as e:
            raise ValueError(f"{source}: {e}") from None
        if upload.q != int(data.get("q", upload.q)):
            raise ValueError(f"{source}: q is {data['q']}, but its steps hold {upload.q} projected gradients each")
        return upload


def encode_broadcast(round_: int, uploads: Sequence[bytes]) -> bytes:
    """The server's message to the clients after round ``round_``: that round's uploads, as they came."""
    return _ROUND.pack(round_, len(uploads)) + b"".join(_LENGTH.pack(len(u)) + u for u in uploads)


def decode_broadcast(data: bytes) -> tuple[int, list[Upload]]:
    round_, count = _ROUND.unpack_from(data)
    at, uploads = _ROUND.size, []
    for _ in range(count):
        (length,) = _LENGTH.unpack_from(data, at)
        uploads.append(Upload.from_bytes(data[at + _LENGTH.size:at + _LENGTH.size + length]))
        at += _LENGTH.size + length
    if at != len(data):
        raise ValueError(f"broadcast of {len(data)} bytes; its {count} uploads end at byte {at}")
    return round_, uploads


def upload_of_run(result: dict, start: int = 0, client: int = 0, round_: int = 0) -> Upload:
    """The upload of a P-RGE training result (the trainer's, or a device run's: both record ``projected_grad``
    per step and the resolved ``config``), whose first step is ``start``."""
    grads = result["projected_grad"]
    return Upload(client, round_, tuple((t, tuple(float(x) for x in g)) for t, g in enumerate(grads, start)),
                  result["config"]["seed"])


def check_upload(method: PRGE, upload: Upload) -> None:
    """Refuse an upload that is not from ``method``'s run: another run seed or q."""
    if (upload.run_seed, upload.q) != (method.seed, method.q):
        raise ValueError(f"the upload is from a run with seed {upload.run_seed} and q = {upload.q}; this client's "
                         f"run has seed {method.seed} and q = {method.q}")


def replay_upload(method: PRGE, upload: Upload) -> PRGE:
    """Apply ``upload``'s steps, in order, to ``method``'s adapter (built for the run's config, holding the adapter
    the client started from): the update of each step from its t and g alone. Returns ``method``."""
    check_upload(method, upload)
    return replay_steps(method, upload.steps, method.lr)
