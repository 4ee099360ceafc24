"""Published numbers the book compares against, with their source (reference data, not our results).

Gao et al., "Enabling efficient on-device fine-tuning of LLMs using only inference engines" (P-RGE);
Guo et al., "Zeroth-order fine-tuning of LLMs with transferable static sparsity" (SensZOQ).

ZERO_SHOT: zero-shot rows of Gao et al. Table 1 (TinyLlama-1.1B) and Table 2 (Llama2-7B),
accuracy in % except SQuAD (F1). CB is not in either table.
"""
from __future__ import annotations

ZERO_SHOT = {
    "TinyLlama-1.1B (Gao et al. Table 1)": {
        "sst2": 55.3, "rte": 52.3, "mrpc": 68.3, "qqp": 32.8, "qnli": 52.7, "wnli": 43.6,
    },
    "Llama2-7B (Gao et al. Table 2)": {
        "sst2": 58.0, "rte": 59.2, "boolq": 71.9, "wsc": 51.9, "wic": 50.0, "multirc": 54.6,
        "copa": 79.0, "winogrande": 62.7, "squad": 23.8,
    },
}
