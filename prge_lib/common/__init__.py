"""Plumbing every layer may use: run-wide settings (``settings``), repository paths (``paths``), the hub check
(``hub``), what result files record (``provenance``), timing and peak memory (``measure``). Imports nothing of
the library.
"""
