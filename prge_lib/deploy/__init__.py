"""Training on the device (chapter 10): the exportable step (``program``), its export to ExecuTorch (``export``),
the program driven from Python (``runtime``) or from the C++ trainer (``native_host``, sources in ``native/``),
the device-training entry that picks the host (``device_train``), and the bundle of wheels, model and data for
an offline GPU machine (``bundle``; ``bundle_install`` is its install script).
"""
