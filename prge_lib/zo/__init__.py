"""The zeroth-order engine (chapters 2, 3, 5, 6): RGE and its seeded noise (``rge``), the counter generator that
runs inside an exported program (``prng``), the seeds of a step and the base of the ZO methods (``estimator``),
MeZO's seed trick (``mezo``), LoRA-FA with n copies of B (``lora``), the P-RGE step with its outer and inner
loops (``prge``), the engine's settings (``defaults``), several runs sharing one forward (``packing``), the
step with all its noise drawn in one call and no host sync (``fused``) and that step replayed as a CUDA graph
per batch shape (``graphs``).
"""
