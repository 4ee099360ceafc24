"""prge_lib: the thin library behind the P-RGE book (zeroth-order on-device fine-tuning of LLMs).

Modules, one concept each: ``config`` (fast mode, paths, seeds), ``models`` (embedded SmolLM2, hub ids,
INT8/NF4), ``tasks`` (the 14 tasks and their templates), ``data`` (MeZO sampling, left padding),
``evaluate`` (zero-shot), ``metrics``, ``objective`` (answer-token cross-entropy, batches), ``rge`` (RGE and
MeZO's seed trick), ``lora`` (LoRA-FA with n copies of B), ``prge`` (the P-RGE step and the ZO methods),
``fo`` (first-order baselines), ``train`` (the trainer: checkpoints, resume, results), ``bench`` (step time
and peak memory), ``provenance`` (what result files record), ``cli`` (``prge``).
"""
__version__ = "0.1.0"
