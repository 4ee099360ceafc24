"""What a federated client uploads and what the server broadcasts (chapter 11): bytes, so that their length is
the measured traffic.

A client's upload after its S local P-RGE steps of round r is its steps' seed indices and projected gradients,
nothing of the adapter's size (Gao et al. Alg. 1: a step is its q seeds, drawn from (run seed, t), and its q
values g_t,i):

    upload     = header (format 1 B, client 2 B, round 4 B, q 2 B, steps S 2 B)
                 then per step: t (4 B, unsigned) and g_t,1 … g_t,q (4 B each, float32)      11 + S(4 + 4q) bytes
    broadcast  = round 4 B, uploads C 2 B, then each upload as length 4 B + bytes

little-endian. The floats are the float32 values the step computed, so whoever decodes a message applies the
client's own update bit for bit.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Sequence

FORMAT = 1
_HEADER = struct.Struct("<BHIHH")
_ROUND = struct.Struct("<IH")
_LENGTH = struct.Struct("<I")


@dataclass(frozen=True)
class Upload:
    """One client's steps of one round: ``steps`` holds (seed index t, its q projected gradients)."""
    client: int
    round: int
    steps: tuple[tuple[int, tuple[float, ...]], ...]

    @property
    def q(self) -> int:
        return len(self.steps[0][1]) if self.steps else 0


def encode_upload(upload: Upload) -> bytes:
    q = upload.q
    if any(len(g) != q for _, g in upload.steps):
        raise ValueError(f"client {upload.client}, round {upload.round}: every step needs q = {q} values")
    parts = [_HEADER.pack(FORMAT, upload.client, upload.round, q, len(upload.steps))]
    step = struct.Struct(f"<I{q}f")
    parts += [step.pack(t, *g) for t, g in upload.steps]
    return b"".join(parts)


def decode_upload(data: bytes) -> Upload:
    version, client, round_, q, count = _HEADER.unpack_from(data)
    if version != FORMAT:
        raise ValueError(f"upload of format {version}; this library reads format {FORMAT}")
    step = struct.Struct(f"<I{q}f")
    if len(data) != _HEADER.size + count * step.size:
        raise ValueError(f"upload of {len(data)} bytes; its header announces {count} steps of q = {q}")
    steps = tuple((t, tuple(g)) for t, *g in (step.unpack_from(data, _HEADER.size + k * step.size)
                                               for k in range(count)))
    return Upload(client, round_, steps)


def encode_broadcast(round_: int, uploads: Sequence[bytes]) -> bytes:
    """The server's message to the clients after round ``round_``: that round's uploads, as they came."""
    return _ROUND.pack(round_, len(uploads)) + b"".join(_LENGTH.pack(len(u)) + u for u in uploads)


def decode_broadcast(data: bytes) -> tuple[int, list[Upload]]:
    round_, count = _ROUND.unpack_from(data)
    at, uploads = _ROUND.size, []
    for _ in range(count):
        (length,) = _LENGTH.unpack_from(data, at)
        uploads.append(decode_upload(data[at + _LENGTH.size:at + _LENGTH.size + length]))
        at += _LENGTH.size + length
    if at != len(data):
        raise ValueError(f"broadcast of {len(data)} bytes; its {count} uploads end at byte {at}")
    return round_, uploads
