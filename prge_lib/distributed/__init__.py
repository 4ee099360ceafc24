"""Data-parallel P-RGE over torch.distributed (chapter 11): workers that share a run's seed exchange only the
q projected gradients of each step (``wire``, ``method``, ``trainer``), rebuild an adapter from its (seed, g)
history (``replay``) or from a client's upload of its steps (``upload``), and measure first-order DDP's traffic
beside it (``ddp``). ``launch`` starts the workers."""
