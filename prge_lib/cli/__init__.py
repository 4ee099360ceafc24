"""The ``prge`` command: the parser and the checks before any work (``main``), and one module per group of
subcommands (``train``, ``bench``, ``device``, ``reproduce``; ``common``: what they share).
"""
