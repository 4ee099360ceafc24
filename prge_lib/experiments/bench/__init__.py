"""Benchmarks: the methods' step time and memory (``methods``), their footprint (``footprint``), MeBP's
(``mebp``), an exported program's step against the eager one (``program``), packed ZO runs against the
same runs alone (``packing``), the per-layer P-RGE step against the fused one (``fused``) and the GPU engine's
configurations: eager, optimised and packed, with run-steps per second and MFU (``engine``).
"""
