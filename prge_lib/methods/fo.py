"""First-order baselines: backpropagation with torch.optim, full fine-tuning or LoRA-FA through peft
(Gao et al. Tables 1–2, "FO-Adam"; chapters 1 and 7).

LoRA-FA here is peft's LoRA with every A frozen after its default init (the same U(−1/√in, 1/√in) law as
``prge_lib.zo.lora``), so FO and ZO train the same parameter space (``prge_lib.methods.adapters.add_peft_lorafa``). On a
GPU that supports bf16 the forward and backward run under bf16 autocast (mixed precision) with fp32 weights
and optimizer states; elsewhere in fp32.
"""
from __future__ import annotations

import contextlib
import math
from typing import Sequence

import torch

from prge_lib.zo.defaults import LORA_ALPHA, LORA_R
from prge_lib.methods.adapters import add_peft_lorafa  # noqa: F401  (re-exported: LoRA-FA lives in adapters)
from prge_lib.zo.lora import DEFAULT_TARGETS
from prge_lib.models.loading import is_quantized
from prge_lib.models.objective import Batch, row_losses

OPTIMIZERS = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}


class FirstOrder:
    """Backprop training of the parameters that require grad, with Adam or SGD (a
    :class:`prge_lib.methods.base.Method`: nothing to record in ``settings``, no phases in ``times``, the
    config alone fixes its ``start``)."""

    def __init__(self, model, lr: float, optimizer: str = "adam", lorafa: bool = False,
                 targets: Sequence[str] = DEFAULT_TARGETS, r: int = LORA_R, alpha: float = LORA_ALPHA):
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {list(OPTIMIZERS)}")
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr must be a positive number, got {lr}")
        if lorafa:
            model = add_peft_lorafa(model, targets, r, alpha)
        elif is_quantized(model.parameters()):
            raise ValueError("full fine-tuning cannot train INT8/NF4 quantized weights; use --quant none "
                             "or the fo-lorafa method (adapter on a quantized base)")
        else:
            for param in model.parameters():
                param.requires_grad_(True)
        model.eval()   # no dropout: the same forward the ZO methods use
        self.model, self.lorafa = model, lorafa
        self.params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.optimizer = OPTIMIZERS[optimizer](list(self.params.values()), lr=lr)
        self.settings: dict = {}
        self.times: dict[str, float] = {}
        self.start: dict = {}
        self.device = next(model.parameters()).device

    def _autocast(self):
        if self.device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step(self, batch: Batch, t: int) -> dict:
        with self._autocast():
            loss = row_losses(self.model, batch).mean()
        value = float(loss.detach())
        if not math.isfinite(value):
            return {"loss": value, "finite": False}
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": value, "finite": True}

    def trainable(self) -> dict[str, torch.Tensor]:
        return self.params
