"""Tasks and their data: the 14 tasks and templates (``tasks``), metrics (``metrics``), the MeZO sampling
protocol and left padding (``splits``), the task pools and text samples shipped with the book (``pools``).
"""
