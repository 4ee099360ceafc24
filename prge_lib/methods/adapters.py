"""Parameter spaces for zeroth-order training, built with peft (Gao et al. App. B, Table 7; chapter 4).

Which weights a ZO method perturbs sets both its cost (chapter 3: four passes over them per query) and its
noise (chapter 2: E‖ĝ_q − g‖² = (d+1)‖g‖²/q for d perturbed coordinates). The spaces, on every linear
layer named in ``targets`` (W: out × in, frozen):

    none     every weight of the model (MeZO full)
    lora     W + (α/r) B A                 A: r × in, B: out × r, both trained; B starts at 0
    lora-fa  the same with every A frozen   only B trained (Zhang et al. 2023; P-RGE's space)
    dora     m ⊙ (W + (α/r) B A) / ‖W + (α/r) B A‖   per output row; A, B and the magnitude m (out) trained
    vera     W + Λ_b B_s Λ_d A_s           B_s, A_s random, frozen and shared by all layers (sized for the
                                           largest out and in, each layer uses its top-left block);
                                           λ_d (r, starts at 0.1) and λ_b (out, starts at 0) trained

Gao et al. use r = 16 for LoRA, LoRA-FA and DoRA and r = 1024 for VeRA (``DEFAULT_R``). peft slices VeRA's
shared matrices per layer, so projections that are not square (SmolLM2's k/v: 576 → 192) are covered.
"""
from __future__ import annotations

import contextlib
from typing import Sequence

import torch

from prge_lib.zo.defaults import LORA_ALPHA, LORA_R
from prge_lib.zo.lora import DEFAULT_TARGETS

ADAPTERS = ("none", "lora", "lora-fa", "dora", "vera")
DEFAULT_R = {"none": LORA_R, "lora": LORA_R, "lora-fa": LORA_R, "dora": LORA_R, "vera": 1024}
# substrings of the trained parameters' names, per space (the tests check that nothing else is trained)
TRAINED_NAMES = {"lora": ("lora_A", "lora_B"), "lora-fa": ("lora_B",),
                 "dora": ("lora_A", "lora_B", "lora_magnitude_vector"),
                 "vera": ("vera_lambda_b", "vera_lambda_d")}


def check_adapter(kind: str) -> str:
    """``kind`` if it names a parameter space, else a ValueError listing the ones there are."""
    if kind not in ADAPTERS:
        raise ValueError(f"unknown adapter {kind!r}; choose one of {list(ADAPTERS)}")
    return kind


def peft_config(kind: str, targets: Sequence[str] = DEFAULT_TARGETS, r: int | None = None,
                alpha: float = LORA_ALPHA, seed: int = 0):
    """The peft config of a space (LoRA-FA is a LoRA config; :func:`add_adapter` freezes its A)."""
    from peft import LoraConfig, VeraConfig

    check_adapter(kind)
    if kind == "none":
        raise ValueError("adapter 'none' trains the model's own weights: there is no peft config")
    r = DEFAULT_R[kind] if r is None else r
    if r < 1:
        raise ValueError(f"adapter rank r must be at least 1, got {r}")
    if kind == "vera":      # no alpha: λ_b and λ_d carry the scale; the shared matrices come from `seed`
        return VeraConfig(r=r, target_modules=list(targets), vera_dropout=0.0, projection_prng_key=seed,
                          save_projection=True)
    return LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, bias="none",
                      use_dora=kind == "dora")


def trainable_parameters(model) -> dict[str, torch.Tensor]:
    """The parameters that require grad, by name, in model order: the list ZO perturbs."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def add_adapter(model, kind: str, targets: Sequence[str] = DEFAULT_TARGETS, r: int | None = None,
                alpha: float = LORA_ALPHA, seed: int | None = 0):
    """Put parameter space ``kind`` on ``model``: returns (model to run, its trainable parameters by name).

    ``none`` returns the model itself with every weight trainable. Otherwise the model is wrapped with peft
    (the base weights frozen) and, for ``lora-fa``, every lora_A is frozen after its default init. LoRA's
    A (and DoRA's) is drawn from torch's global generator: with ``seed`` it is drawn from a generator seeded
    with it and the global state is left as it was; ``seed=None`` draws from the global state.
    """
    from peft import get_peft_model

    check_adapter(kind)
    if kind == "none":
        for param in model.parameters():
            param.requires_grad_(True)
        return model, dict(model.named_parameters())
    config = peft_config(kind, targets, r, alpha, 0 if seed is None else seed)
    if kind == "dora":
        from peft.tuners.lora import dora
        if getattr(dora, "ENABLE_DORA_CACHING", False):
            raise ValueError("peft's DoRA caching is on (peft.helpers.DoraCaching): it would keep the weight "
                             "norms of the first forward while zeroth-order training perturbs B between "
                             "forwards in eval mode; turn it off")
    rng = contextlib.nullcontext() if seed is None else torch.random.fork_rng(devices=[])
    with rng:
        if seed is not None:
            torch.manual_seed(seed)
        try:
            model = get_peft_model(model, config)
        except ValueError as err:      # e.g. no layer with these names: say which targets were asked for
            raise ValueError(f"cannot put a {kind} adapter on targets {list(targets)}: {err}") from err
    if kind == "lora-fa":
        for name, param in model.named_parameters():
            if "lora_A" in name:
                param.requires_grad_(False)
    return model, trainable_parameters(model)


def add_peft_lorafa(model, targets: Sequence[str] = DEFAULT_TARGETS, r: int = LORA_R, alpha: float = LORA_ALPHA,
                    seed: int | None = None):
    """peft LoRA on ``targets`` with every LoRA-A frozen (LoRA-FA). Returns the peft model.

    Its A follows peft's default init, U(−1/√in, 1/√in): the law ``prge_lib.zo.lora`` uses too, so first-order
    and zeroth-order runs train the same space."""
    return add_adapter(model, "lora-fa", targets, r, alpha, seed)[0]
