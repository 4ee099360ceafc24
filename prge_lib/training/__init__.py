"""Training: the config of a run (``config``), the checks made before any work (``checks``), checkpoints read
back as data (``checkpoints``), the trainer shared by every method (``trainer``: data order, evaluation, resume,
result), several runs trained in one forward (``packed``), and zero-shot evaluation (``evaluate``).
"""
