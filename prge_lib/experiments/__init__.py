"""Reproducing the papers: the grids of their tables run cell by cell with summaries (``reproduce``), the
papers' published numbers (``paper``) and the benchmarks (``bench``).
"""
