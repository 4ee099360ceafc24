"""A small random Llama with a real tokenizer's vocabulary: what the tests train, and what a fast-mode cell
exports when the point is the mechanics (chapter 11), not the scores.

Two decoder layers of width 64, 4 heads over 2 key/value heads, so the k/v projections are 64 → 32 (not
square), like SmolLM2's 576 → 192; seeded, so every call with one seed gives the same weights.
"""
from __future__ import annotations

from pathlib import Path

import torch


def tiny_llama(tokenizer, seed: int = 0, layers: int = 2):
    """A fresh seeded Llama of ``layers`` decoder layers over ``tokenizer``'s vocabulary, in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config).eval()


def save_tiny_llama(tokenizer, folder, seed: int = 0) -> Path:
    """The tiny model and ``tokenizer`` written as a local model folder, loadable by name
    (``prge_lib.models.loading.load_model(str(folder))``) and by the command line's ``--model``."""
    tiny_llama(tokenizer, seed).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)
