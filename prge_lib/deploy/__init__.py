"""Training on the device (chapter 10): the exportable step (``program``), its export to ExecuTorch (``export``),
the program driven from Python (``runtime``) or from the C++ trainer (``native_host``, sources in ``native/``),
the device-training entry that picks the host (``device_train``), an ExecuTorch client's round replayed by an eager
client (``client``; chapter 11), and the bundle of wheels, model and data for
an offline GPU machine (``bundle``; ``bundle_install`` is its install script).
"""
