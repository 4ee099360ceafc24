"""Benchmarks: the methods' step time and memory (``methods``), their footprint (``footprint``), MeBP's
(``mebp``), an exported program's step against the eager one (``program``) and packed ZO runs against the
same runs alone (``packing``).
"""
