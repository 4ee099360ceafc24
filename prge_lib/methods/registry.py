"""The training methods by name (chapters 1–9): one :class:`MethodSpec` per method, declared once here. The
trainer, the command line, the benchmarks and the reproduction grids read names, families and defaults from
this registry, so a new method is one spec (and its module) passed to :func:`register`.

A builder receives the resolved training config (``prge_lib.training.trainer.TrainConfig``, read by attribute:
this layer does not import the trainer), the loaded model, its tokenizer and ``task_batches()`` (the task's
training batches, for methods that rank weights on them), and returns a :class:`prge_lib.methods.base.Method`.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from typing import TYPE_CHECKING

if TYPE_CHECKING:       # the builders import their method's module when they run: reading names is light
    from prge_lib.methods.base import Method

FAMILIES = ("zo", "fo")     # zeroth-order (ZO-SGD on q seeded queries) or first-order (backpropagation)
# Settings that only some methods read; a spec names those its method reads (``uses``). For the other methods
# the trainer drops a NULLED setting (it records None) and refuses a REFUSED one set away from its default.
NULLED = ("eps", "q", "E", "inner", "sparsity", "mask", "mask_scope")
REFUSED = ("adapter", "noise", "program", "mmap_dir", "engine", "cuda_graphs", "length_groups")

Config = Any        # a resolved TrainConfig, read by attribute
Builder = Callable[[Config, Any, Any, Callable[[], list] | None], "Method"]


@dataclass(frozen=True)
class MethodSpec:
    """One training method: its ``name`` (``--method``), ``family`` ("zo" or "fo": the trainer's batch and
    optimizer checks), ``defaults`` (filled where the config leaves a setting None), the method-scoped settings
    it ``uses`` (of :data:`NULLED` and :data:`REFUSED`), whether it quantizes its own base
    (``self_quantizing``: the model loads unquantized, the method quantizes what it does not train; chapters 8
    and 9), its ``build`` function, ``adapter_defaults`` (replacing defaults when it runs over a peft adapter)
    and ``check`` (its own settings checks on the resolved config, each error naming the value)."""

    name: str
    family: str
    build: Builder
    defaults: Mapping[str, Any]
    uses: frozenset[str] = frozenset()
    self_quantizing: bool = False
    adapter_defaults: Mapping[str, Any] = field(default_factory=dict)
    check: Callable[[Config], None] | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a method name is a non-empty string, got {self.name!r}")
        if self.family not in FAMILIES:
            raise ValueError(f"method {self.name!r}: unknown family {self.family!r}; choose one of {list(FAMILIES)}")
        unknown = sorted(set(self.uses) - set(NULLED) - set(REFUSED))
        if unknown:
            raise ValueError(f"method {self.name!r}: uses {unknown} are not method-scoped settings; choose from "
                             f"{list(NULLED + REFUSED)}")
        if self.adapter_defaults and "adapter" not in self.uses:
            raise ValueError(f"method {self.name!r} has adapter_defaults but does not use 'adapter'")
        object.__setattr__(self, "uses", frozenset(self.uses))
        object.__setattr__(self, "defaults", MappingProxyType(dict(self.defaults)))
        object.__setattr__(self, "adapter_defaults", MappingProxyType(dict(self.adapter_defaults)))

    @property
    def builds_from_start(self) -> bool:
        """Whether ``build`` takes a ``start``: a checkpoint's :attr:`~prge_lib.methods.base.Method.start`, which a
        resumed run is built from (SensZOQ's mask)."""
        return "start" in inspect.signature(self.build).parameters

    def load_quant(self, quant: str) -> str:
        """The quantization the model loads with for a run whose config says ``quant``: none for a method
        that quantizes its base itself."""
        return "none" if self.self_quantizing else quant


_REGISTRY: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    """Add ``spec`` to the registry; a name already registered is refused."""
    if spec.name in _REGISTRY:
        raise ValueError(f"method {spec.name!r} is already registered; choose another name")
    _REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> MethodSpec:
    """Remove method ``name`` from the registry and return its spec."""
    get(name)
    return _REGISTRY.pop(name)


def get(name: str) -> MethodSpec:
    """The spec of method ``name``, or a ValueError listing the methods there are."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown method {name!r}; choose one of {list(_REGISTRY)}")
    return _REGISTRY[name]


def names(family: str | None = None) -> tuple[str, ...]:
    """The registered methods (of ``family`` only, if given), in the order they were registered."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {list(FAMILIES)}")
    return tuple(n for n, spec in _REGISTRY.items() if family in (None, spec.family))


def users(setting: str) -> tuple[str, ...]:
    """The methods that use the method-scoped ``setting``."""
    return tuple(n for n, spec in _REGISTRY.items() if setting in spec.uses)


# ----------------------------------------------------------------------------------------- the methods
def _truncated(config: Config, model):
    """``model`` cut to its first ``config.layers`` decoder layers, when set."""
    from prge_lib.models.loading import truncate_layers

    if config.layers is not None:
        truncate_layers(model, config.layers)
    return model


def _build_first_order(c: Config, model, tokenizer=None, task_batches=None, *, lorafa: bool):
    import torch

    from prge_lib.methods.fo import FirstOrder

    if lorafa:
        torch.manual_seed(c.seed)     # peft draws A from torch's global generator
    return FirstOrder(model, c.lr, c.optimizer, lorafa, c.targets, c.r, c.alpha)


def _build_mezo(c: Config, model, tokenizer=None, task_batches=None):
    """MeZO over every weight, or over a peft adapter's trainable parameters (prge_lib.methods.adapters)."""
    from prge_lib.methods.adapters import add_adapter
    from prge_lib.zo.mezo import MeZOFull

    if c.adapter == "none":
        return MeZOFull(model, c.q, c.eps, c.lr, c.seed, length_groups=c.length_groups)
    model, params = add_adapter(model, c.adapter, c.targets, c.r, c.alpha, seed=c.seed)
    return MeZOFull(model, c.q, c.eps, c.lr, c.seed, params=params, length_groups=c.length_groups)


def _build_prge(c: Config, model, tokenizer=None, task_batches=None):
    """P-RGE on LoRA-FA layers injected into ``model`` (mezo-lorafa: q = 1)."""
    from prge_lib.zo.lora import inject_lorafa
    from prge_lib.zo.prge import PRGE

    if c.program is not None:
        raise ValueError("a config with a program trains through the runtime host: Trainer(config, "
                         "method_builder=prge_lib.deploy.runtime.build_program_method), or prge device-train")
    layers = inject_lorafa(_truncated(c, model), c.targets, c.r, c.alpha, seed=c.seed, noise=c.noise)
    if getattr(c, "engine", None) == "fused":       # all noise in one call, no host sync (chapter 5)
        from prge_lib.zo.fused import FusedPRGE
        from prge_lib.zo.graphs import GraphedPRGE

        fused = GraphedPRGE if c.cuda_graphs else FusedPRGE
        return fused(model, layers, c.q, c.eps, c.lr, c.seed, c.outer, c.inner)
    return PRGE(model, layers, c.q, c.eps, c.lr, c.seed, c.outer, c.inner, c.keep_noise, c.length_groups)


def _build_senszoq(c: Config, model, tokenizer=None, task_batches=None, start=None):
    """SensZOQ; its C4 mask needs the ``tokenizer``, a "task" mask ``task_batches()``; ``start``: a checkpoint's
    mask, used instead of either (a run resumed on another machine)."""
    from prge_lib.methods.senszoq.sparse import build_senszoq

    batches = task_batches() if c.mask == "task" and start is None else None
    return build_senszoq(_truncated(c, model), tokenizer, mask=c.mask, sparsity=c.sparsity, scope=c.mask_scope,
                         quant=c.quant, q=c.q, eps=c.eps, lr=c.lr, seed=c.seed, task_batches=batches,
                         outer=c.outer and c.q > 1, inner=bool(c.inner), start=start, length_groups=c.length_groups)


def _build_mebp(c: Config, model, tokenizer=None, task_batches=None):
    from prge_lib.methods.mebp import MeBP

    return MeBP(_truncated(c, model), c.lr, c.r, c.alpha, c.targets, c.quant, c.mmap_dir, c.seed)


def _check_mezo_lorafa(c: Config) -> None:
    if c.q != 1:
        raise ValueError(f"mezo-lorafa is P-RGE with q = 1; got q = {c.q} (use --method prge)")


def _check_prge(c: Config) -> None:
    if c.program is not None:
        if not (c.outer and c.inner) or c.noise != "counter":
            raise ValueError("a program runs P-RGE with the outer and inner loops and counter noise: "
                             "use method prge, outer and inner on, noise 'counter'")
        if c.max_length is None:
            raise ValueError("a program has a fixed sequence length: set max_length to it")


def _check_senszoq(c: Config) -> None:
    from prge_lib.methods.senszoq.sensitivity import check_mask_settings

    check_mask_settings(c.mask, c.sparsity, c.mask_scope)


def _check_mebp(c: Config) -> None:
    if c.optimizer != "adam":
        raise ValueError(f"mebp trains with Adam (seed 004); got optimizer {c.optimizer!r}")


_ZO = frozenset({"eps", "q", "E", "inner", "length_groups"})

# Gao et al. App. C (Table 10): batch sizes, and one value from each learning-rate grid
register(MethodSpec("fo", "fo", functools.partial(_build_first_order, lorafa=False),
                    {"lr": 1e-5, "batch_size": 8}))
register(MethodSpec("fo-lorafa", "fo", functools.partial(_build_first_order, lorafa=True),
                    {"lr": 3e-4, "batch_size": 8}))
register(MethodSpec("mezo", "zo", _build_mezo, {"lr": 1e-6, "eps": 1e-3, "q": 1, "E": 16, "inner": False},
                    uses=_ZO | {"adapter"},
                    # MeZO over a peft adapter (--adapter, chapter 4): the LoRA-FA step size and ε of
                    # mezo-lorafa, not the full-weight ones (Gao et al. App. B searched lr in {5e-6, 5e-5,
                    # 5e-4, 5e-3} and ε in {1e-3, 1e-2})
                    adapter_defaults={"lr": 1e-3, "eps": 1e-2}))
register(MethodSpec("mezo-lorafa", "zo", _build_prge,
                    {"lr": 1e-3, "eps": 1e-2, "q": 1, "E": 16, "inner": False},
                    uses=_ZO | {"noise", "engine", "cuda_graphs"}, check=_check_mezo_lorafa))
register(MethodSpec("prge", "zo", _build_prge, {"lr": 1e-3, "eps": 1e-2, "q": 4, "E": 16, "inner": True},
                    uses=_ZO | {"noise", "program", "engine", "cuda_graphs"}, check=_check_prge))
# Guo et al. (SensZOQ) App. D: ZO-SGD, ε 1e-3, batch 16. The lr came from a 100-step SST-2 probe with the C4 mask at
# 0.1% (tools/probe_senszoq_lr, result files in data/results/probes/senszoq_lr/). Rerun, the probe no longer singles
# out 1e-4: 1e-3 ends lower in training loss after a spike, 1e-4 ahead on 100 validation sentences, within one
# standard error. 1e-4 stays the default the committed cpu-profile cells ran at; the senszoq grid (chapter 8) chooses
# each mask's rate on validation from a sweep.
register(MethodSpec("senszoq", "zo", _build_senszoq,
                    {"lr": 1e-4, "eps": 1e-3, "q": 1, "E": 16, "inner": False,
                     "sparsity": 1e-3, "mask": "c4", "mask_scope": "layer"},
                    uses=_ZO | {"sparsity", "mask", "mask_scope"}, self_quantizing=True, check=_check_senszoq))
# MeBP trains LoRA (A and B) with Adam: the FO LoRA-FA step size and batch
register(MethodSpec("mebp", "fo", _build_mebp, {"lr": 3e-4, "batch_size": 8}, uses={"mmap_dir"},
                    self_quantizing=True, check=_check_mebp))
