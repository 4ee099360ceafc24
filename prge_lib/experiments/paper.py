"""Published numbers the book compares against, with their source (reference data, not our results).

Gao et al., "Enabling efficient on-device fine-tuning of LLMs using only inference engines" (P-RGE);
Guo et al., "Zeroth-order fine-tuning of LLMs with transferable static sparsity" (SensZOQ).

TABLE1, TABLE2: Gao et al.'s accuracy tables (TinyLlama-1.1B, Llama2-7B), in % except SQuAD (F1); ZERO_SHOT: their
zero-shot rows by model. CB is not in either table.
"""
from __future__ import annotations

from prge_lib.data.tasks import TABLE1_TASKS, TABLE2_TASKS

# Gao et al. Table 1: TinyLlama-1.1B, accuracy (%) on the MeZO protocol (1000 / 500 / 1000), ZO 20k steps,
# FO 1000 steps, E = 16 for every ZO row. Keys are the reproduction runner's row keys (prge_lib.experiments.reproduce).
TABLE1 = {
    "zeroshot": {"sst2": 55.3, "rte": 52.3, "mrpc": 68.3, "qqp": 32.8, "qnli": 52.7, "wnli": 43.6},
    "fo": {"sst2": 91.9, "rte": 72.5, "mrpc": 77.4, "qqp": 82.4, "qnli": 80.8, "wnli": 56.3},
    "fo-lorafa": {"sst2": 94.2, "rte": 82.6, "mrpc": 82.3, "qqp": 84.4, "qnli": 86.5, "wnli": 56.3},
    "mezo-E16": {"sst2": 91.2, "rte": 67.9, "mrpc": 70.6, "qqp": 72.0, "qnli": 67.9, "wnli": 57.8},
    "mezo-lorafa-E16": {"sst2": 87.5, "rte": 67.9, "mrpc": 71.6, "qqp": 74.6, "qnli": 67.2, "wnli": 60.6},
    "prge-q4-E16": {"sst2": 89.1, "rte": 70.8, "mrpc": 75.5, "qqp": 77.9, "qnli": 76.0, "wnli": 60.6},
    "prge-q16-E16": {"sst2": 90.8, "rte": 68.6, "mrpc": 76.7, "qqp": 79.1, "qnli": 75.0, "wnli": 57.8},
}
# Gao et al. Table 2 (arXiv; the Llama2-7B half of Table 2 in the ACL version): Llama2-7B, the same protocol and
# budgets as Table 1, accuracy (%) except SQuAD (F1), columns in TABLE2_TASKS' order. Keys are Table 1's row keys.
TABLE2 = {key: dict(zip(TABLE2_TASKS, values)) for key, values in {
    "zeroshot": (58.0, 59.2, 71.9, 51.9, 50.0, 54.6, 79.0, 62.7, 23.8),
    "fo": (92.5, 78.7, 80.6, 63.4, 67.2, 71.7, 81.0, 68.2, 79.2),
    "fo-lorafa": (96.0, 88.1, 85.7, 79.8, 75.1, 84.2, 87.0, 71.8, 77.2),
    "mezo-E16": (93.7, 72.6, 81.1, 64.4, 54.6, 69.9, 81.0, 64.4, 76.9),
    "mezo-lorafa-E16": (94.4, 72.9, 80.7, 64.4, 60.0, 73.1, 86.0, 64.5, 79.5),
    "prge-q4-E16": (94.9, 76.2, 83.0, 63.5, 64.4, 74.5, 85.0, 65.4, 79.8),
    "prge-q16-E16": (94.2, 77.6, 82.5, 65.4, 62.9, 74.9, 87.0, 65.7, 78.6),
}.items()}
ZERO_SHOT = {"TinyLlama-1.1B (Gao et al. Table 1)": TABLE1["zeroshot"],
             "Llama2-7B (Gao et al. Table 2)": TABLE2["zeroshot"]}
# Gao et al. Table 12: minutes per task of the ZO runs behind Table 1 (TinyLlama-1.1B, 20k steps, one GPU).
# Keys are Table 1's row keys for the variants the runner trains (MeZO (LoRA-FA) without the inner loop, P-RGE
# with both loops); the "-outer" and "-inner" keys are the table's other variants.
TABLE12_MINUTES = {
    "tasks": TABLE1_TASKS,     # the table's columns, in the order of Table 1
    "mezo-E16": (38.31, 61.51, 45.71, 40.76, 46.30, 43.57),
    "mezo-lorafa-E16": (34.66, 55.53, 35.45, 35.00, 37.44, 34.40),
    "mezo-lorafa-inner": (23.55, 54.07, 35.72, 28.76, 36.59, 33.22),
    "prge-q4-outer": (36.27, 45.22, 36.90, 36.19, 35.33, 37.23),
    "prge-q4-E16": (23.68, 43.75, 34.07, 25.83, 31.97, 29.09),
    "prge-q16-outer": (35.57, 38.18, 35.38, 35.19, 35.86, 35.34),
    "prge-q16-E16": (24.77, 31.98, 29.90, 24.31, 27.43, 25.84),
}
# Gao et al. (arXiv version) Table 8, Table 12 in the ACL version: P-RGE outer loop only, Llama2-7B, seconds per
# step at E = q · B = 16, per sequence length and q (1, 4, 16).
TABLE8_SECONDS = {"qs": (1, 4, 16), 64: (0.18, 0.20, 0.19), 128: (0.35, 0.37, 0.32), 256: (0.69, 0.67, 0.71)}
# Gao et al.'s standard benchmark (§4.2, Fig. 5; Table 13 of the ACL version): seconds per step of Llama2-7B on
# full-length synthetic rows, per sequence length and batch size B, for MeZO (LoRA-FA) (q = 1, the two forwards
# one after the other) and P-RGE with the inner loop only (q = 1, both in one forward of 2B rows); fp16, one A100.
TABLE13_SECONDS = {"seq_lens": (64, 128, 256), "batch_sizes": (1, 8, 16),
                   "mezo-lorafa": {64: (0.07, 0.11, 0.18), 128: (0.07, 0.19, 0.35), 256: (0.07, 0.35, 0.69)},
                   "prge-inner": {64: (0.04, 0.10, 0.18), 128: (0.04, 0.18, 0.34), 256: (0.06, 0.34, 0.67)}}
# the largest inner-loop speed-ups the text states: fp16 (Fig. 5 and Table 13, Llama2-7B, L 64, B 1) and NF4
# weights (Fig. 6, "over the sequential execution of two forward passes")
INNER_MAX_SPEEDUP = {"fp16": 1.79, "nf4": 1.97}
# Gao et al. Table 7: ZO-SGD on OPT-1.3B, SST-2, 10k steps, accuracy (%) per parameter space.
TABLE7 = {"mezo-lora": 90.9, "mezo-lora-fa": 92.0, "mezo-dora": 90.9, "mezo-vera": 91.4}

# A from-scratch implementation of P-RGE, written independently of prge_lib and run on the same 2-core CPU
# with the same settings (embedded SmolLM2-135M, LoRA-FA r 16 / alpha 32 on all seven projections with
# peft's A init, q 4, E 16, lr 1e-3, eps 1e-2, SST-2, 1000 training sentences, answer-token cross-entropy):
# validation accuracy (%) averaged over its seeds 0, 1, 2 at steps 250 / 500 / 750, and the test accuracy
# (872 GLUE dev sentences) of each seed after 1000 steps. Driven by the same random streams (data sample,
# A, noise), prge_lib's step reproduces its accuracy exactly; chapter 7 compares the two over seeds.
REFERENCE_PRGE_SST2 = {"val_mean": {250: 61.0, 500: 68.0, 750: 74.0}, "test_1000": {0: 77.8, 1: 73.4, 2: 74.9}}

# Gao et al. (ACL version) Table 3: peak memory (GB) of TinyLlama-1.1B on an A100, weights included (ZO in
# fp16, FO in mixed precision), per sequence length and batch size B (P-RGE: both loops, q·E = B). Keys are
# the memory grid's configurations (prge_lib.experiments.bench.methods.CONFIGS).
TABLE3_MEMORY_GB = {
    "seq_lens": (64, 128, 256), "batch_sizes": (1, 8, 16),
    "fo": {64: (11.32, 12.00, 12.78), 128: (11.44, 13.00, 14.76), 256: (11.77, 15.62, 20.02)},
    "fo-lorafa": {64: (4.15, 5.00, 5.98), 128: (4.27, 5.98, 7.81), 256: (4.51, 7.81, 11.58)},
    "mezo-lorafa": {64: (2.09, 2.19, 2.32), 128: (2.10, 2.32, 2.56), 256: (2.13, 2.56, 3.05)},
    "prge": {64: (2.11, 2.32, 2.56), 128: (2.14, 2.56, 3.05), 256: (2.20, 3.05, 3.98)},
}

# Guo et al. Table 9 (a): the learning rate chosen for each mask on RTE at 0.1% sparsity (Llama2-7B, eps 1e-3,
# static masks), the rates the senszoq grid's sweep is built to bracket on the embedded model (chapter 8)
SENSZOQ_TABLE9_RTE = {"c4": 1e-6, "task": 1e-6, "random": 5e-4, "largest": 2e-4, "smallest": 1e-4}

# Guo et al. Table 1 (a), SST-2 validation accuracy (%), mean of 3 trials, Llama2-7B quantized to 4 bits
# (SqueezeLLM), ZO-SGD: SensZOQ (C4 mask, 0.1%) against ZO on LoRA over the same quantized weights, the
# like-for-like baseline chapter 8 sets beside SensZOQ (the senszoq grid's ZO-SGD LoRA row, over NF4)
SENSZOQ_TABLE1_SST2 = {"model": "Llama2-7B", "senszoq": 94.4, "zo-lora": 92.9}
