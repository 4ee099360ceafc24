"""SensZOQ (Guo et al.; chapter 8): squared-gradient sensitivity and its masks (``sensitivity``), the sparse +
NF4 layer and ZO on its sparse values (``sparse``).
"""
