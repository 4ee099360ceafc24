"""Models: what can be asked for (``options``: the embedded model's name, precisions, quantization modes),
loading the embedded SmolLM2 or a hub id in fp32/fp16, INT8 or NF4 (``loading``), an NF4 matrix (``quant``), and
what a model is scored on: batches and the answer-token cross-entropy (``objective``), with batches padded to
a few fixed lengths (``buckets``); and a small random Llama for the tests and fast-mode cells (``tiny``).
"""
