"""prge_lib: the thin library behind the P-RGE book (zeroth-order on-device fine-tuning of LLMs).

Modules, one concept each: ``config`` (fast mode, paths, seeds), ``models`` (embedded SmolLM2, hub ids,
INT8/NF4), ``tasks`` (the 14 tasks and their templates), ``data`` (MeZO sampling, left padding), ``pools``
(the task pools shipped with the book), ``evaluate`` (zero-shot), ``metrics``, ``objective`` (answer-token
cross-entropy, batches), ``rge`` (RGE, seeded noise, the ZO settings checks), ``mezo`` (MeZO's seed trick and
MeZO over any tensors), ``lora`` (LoRA-FA with n copies of B), ``prge`` (the P-RGE step), ``adapters`` (peft
parameter spaces), ``sensitivity`` and ``sparse`` (SensZOQ: Fisher masks; the sparse + NF4 layer and ZO on
its sparse values), ``fo`` (first-order baselines), ``train`` (the trainer: checkpoints, resume, results),
``reproduce`` (the papers' tables as resumable grids), ``measure`` (timing and peak memory), ``bench`` (the
method benchmarks), ``prng``, ``program``, ``export`` and ``runtime`` (the counter generator, the exportable
step, its export, the ExecuTorch runtime host), ``program_bench``, ``provenance`` (what result files record),
``cli`` (``prge``).
"""
__version__ = "0.1.0"
