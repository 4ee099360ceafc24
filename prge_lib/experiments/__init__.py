"""Reproducing the papers: the grids of their tables run cell by cell with summaries (``reproduce``, which
gathers ``grids``, ``cells``, ``estimates``, ``results``, ``locks``, ``status``, ``runner`` and ``summaries``), the
papers' published numbers (``paper``), the benchmarks (``bench``) and a GPU sitting's stages (``sitting``).
"""
