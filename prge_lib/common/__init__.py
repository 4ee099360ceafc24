"""Plumbing every layer may use: run-wide settings (``settings``), repository paths (``paths``), the hub check
(``hub``), what result files record (``provenance``), timing and peak memory (``measure``), the numbers of a
chapter's prose (``prose``: glue, and `{eval}` roles resolved from glued values). Imports nothing of the library.
"""
