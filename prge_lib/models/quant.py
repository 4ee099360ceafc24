"""A weight matrix held in 4 bits (NF4, bitsandbytes) and dequantized on demand: the dense base shared by
SensZOQ (chapter 8: the remainder after the sensitive weights are taken out) and MeBP (chapter 9: a block's
weights, dequantized only while the block runs).

NF4 (Dettmers et al. 2023) stores each block of 64 weights as 4-bit indices into 16 normal quantiles plus
one fp32 scale (the block's absolute maximum): 4.5 bits per weight instead of 32. bitsandbytes does the
quantizing; this module only keeps the packed bytes and the state together and counts the bytes.
"""
from __future__ import annotations

import torch

BLOCK = 64   # weights per NF4 scale (bitsandbytes' default for 4-bit)


class NF4Weight:
    """``weight`` quantized to NF4; :meth:`dequantize` gives back an fp32 (or ``dtype``) matrix of its shape."""

    def __init__(self, weight: torch.Tensor, blocksize: int = BLOCK):
        import bitsandbytes.functional as bnbf

        if weight.dim() != 2:
            raise ValueError(f"NF4Weight holds a matrix; got a tensor of shape {tuple(weight.shape)}")
        if weight.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"NF4Weight quantizes a floating-point matrix; got {weight.dtype}")
        self.shape, self.dtype = tuple(weight.shape), weight.dtype
        self.packed, self.state = bnbf.quantize_4bit(weight.detach().contiguous(), blocksize=blocksize,
                                                     quant_type="nf4")

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        import bitsandbytes.functional as bnbf

        out = bnbf.dequantize_4bit(self.packed, self.state)
        return out.to(dtype or self.dtype).reshape(self.shape)

    def nbytes(self) -> int:
        """Bytes held: the packed 4-bit indices plus the per-block scales."""
        return self.packed.numel() * self.packed.element_size() + \
            self.state.absmax.numel() * self.state.absmax.element_size()

    def to(self, device) -> "NF4Weight":
        self.packed = self.packed.to(device)
        self.state = self.state.to(device) or self.state
        return self
