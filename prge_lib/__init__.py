"""prge_lib: the thin library behind the P-RGE book (zeroth-order on-device fine-tuning of LLMs).

Layers, each a subpackage that imports only the ones listed before it (checked by ``lint-imports``):

- ``common``: settings, repository paths, provenance, measurement;
- ``data``: tasks, metrics, sampling, shipped pools;
- ``models``: loading (embedded SmolLM2, hub ids, INT8/NF4), NF4 matrices, the answer-token objective;
- ``zo``: the ZO engine: RGE, the counter generator, MeZO, LoRA-FA with copies, P-RGE;
- ``methods``: first-order baselines, peft spaces, SensZOQ, MeBP, and the registry of every method by name;
- ``training``: the config and the trainer shared by every method, zero-shot evaluation;
- ``deploy``: the exportable step, its export to ExecuTorch, the Python and C++ hosts;
- ``experiments``: the papers' grids and summaries, their numbers, the benchmarks;
- ``cli``: the ``prge`` command.
"""
__version__ = "0.1.0"
