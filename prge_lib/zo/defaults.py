"""The ZO engine's settings, declared once (Gao et al. App. C; chapters 4–6). Plain values only: the command line
reads them to build its options without loading torch."""

# LoRA-FA's rank and scale: r = 16, α = 32 for LoRA, LoRA-FA and DoRA (VeRA's rank: prge_lib.methods.adapters)
LORA_R = 16
LORA_ALPHA = 32
# every attention and MLP projection of Llama-style models (SmolLM2, TinyLlama, Llama 2)
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# where a layer's noise comes from: torch's generator (prge_lib.zo.rge.gaussian) or the counter generator
NOISE_SOURCES = ("torch", "counter")
# how a P-RGE step runs: per layer and seed (the reference, the CPU's default) or fused (all noise in one
# counter-generator call, one update for the whole adapter, no host sync: prge_lib.zo.fused; a GPU's default)
ENGINES = ("layerwise", "fused")
# The trainer keeps each step's noise for the update (instead of redrawing it from the seeds) when the q·d
# floats fit in this many MiB: redrawing costs as much time as the first draw, which grows with q (chapter 5
# measures it), while keeping holds q·d floats during the step: 152 MiB at q = 16 for SmolLM2-135M
# (d = 2.49 M), 38 MiB at q = 4. TinyLlama-1.1B at q = 16 (385 MiB) redraws, as the paper's design does.
KEEP_NOISE_BUDGET_MIB = 256
