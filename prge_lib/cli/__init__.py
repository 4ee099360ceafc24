"""The ``prge`` command (``main``).
"""
