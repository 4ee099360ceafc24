"""The training methods beside the ZO engine: first-order baselines through peft (``fo``), peft parameter spaces
for MeZO (``adapters``), SensZOQ (``senszoq``: sensitivity masks and sparse ZO over a 4-bit base) and MeBP
(``mebp``); what the trainer needs of a method (``base``) and every method by name with its family, defaults and
builder (``registry``).
"""
