"""The training loss (chapter 3): cross-entropy at the answer tokens, computed from the last positions only."""
import pytest
import torch
import torch.nn.functional as F

from prge_lib.zo.lora import inject_lorafa
from prge_lib.models.objective import IGNORE, collate, last_positions, row_losses


def _padded_batch(vocab_size: int):
    gen = torch.Generator().manual_seed(3)
    items = []
    for length, width in ((9, 1), (5, 3), (7, 2)):     # rows of different lengths and target widths
        ids = torch.randint(0, vocab_size, (length,), generator=gen).tolist()
        target = torch.randint(0, vocab_size, (width,), generator=gen).tolist()
        items.append((ids, target))
    return collate(items, pad_id=0)


def test_row_losses_equal_the_cross_entropy_of_the_full_logits(tiny_factory):
    model = tiny_factory()
    inject_lorafa(model)                       # frozen weights: the case whose head input used to be strided
    batch = _padded_batch(model.config.vocab_size)
    with torch.no_grad():
        full = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        width = batch.targets.shape[1]
        expected = []
        for row in range(batch.rows):
            keep = batch.targets[row] != IGNORE
            logits = full[row, -width:][keep]
            expected.append(F.cross_entropy(logits, batch.targets[row][keep]))
        torch.testing.assert_close(row_losses(model, batch), torch.stack(expected), rtol=1e-5, atol=1e-6)


def test_the_vocabulary_head_gets_one_contiguous_matrix(tiny_factory):
    """With a count, the model slices its hidden states into a strided view and, for frozen weights, PyTorch
    runs the head as a batched product over the expanded weight; positions give it a contiguous input."""
    model = tiny_factory()
    inject_lorafa(model)
    seen = []
    model.lm_head.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with torch.no_grad():
        row_losses(model, _padded_batch(model.config.vocab_size))
    assert len(seen) == 1 and seen[0].is_contiguous() and seen[0].shape[:2] == (3, 3)


def test_last_positions():
    assert last_positions(2, 5).tolist() == [3, 4]
    with pytest.raises(ValueError, match="last 6 of 5 positions"):
        last_positions(6, 5)
