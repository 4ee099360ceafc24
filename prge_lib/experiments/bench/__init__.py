"""Benchmarks: the methods' step time and memory (``methods``), their footprint (``footprint``), MeBP's
(``mebp``) and an exported program's step against the eager one (``program``).
"""
