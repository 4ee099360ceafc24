"""Training: the config, the trainer shared by every method (data order, evaluation, checkpoints, resume,
result) in ``trainer``, and zero-shot evaluation (``evaluate``).
"""
