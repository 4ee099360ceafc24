"""``prge federate``: federated P-RGE rounds over simulated clients, and with ``--baseline`` the centralised
P-RGE run over the same batches (chapter 11, :mod:`prge_lib.distributed.federated`)."""
from __future__ import annotations

import time
from pathlib import Path

from prge_lib.common.provenance import provenance, write_result
from prge_lib.distributed.shards import SPLITS

CONFIG_FIELDS = ("task", "q", "E", "eps", "lr", "seed", "n_train", "n_val", "n_test", "max_length", "layers",
                 "eval_batch_size", "model", "device")


def run_federate(args) -> int:
    from prge_lib.deploy.client import program_client
    from prge_lib.distributed.federated import FederatedConfig, FederatedRun
    from prge_lib.models.options import EMBEDDED
    from prge_lib.training.config import TrainConfig
    from prge_lib.training.trainer import Trainer

    device_clients = parse_clients(args.device_clients)
    if device_clients and not args.program:
        raise ValueError("--device-clients needs --program, the exported training step they run (prge export)")
    if args.program and not device_clients:
        raise ValueError("--program is the step of the device clients; name them with --device-clients")
    config = TrainConfig(method="prge", steps=1, eval_every=0,
                         **{name: getattr(args, name) for name in CONFIG_FIELDS},
                         # a device client draws its program's counter noise; the eager clients replay with it
                         **({"noise": "counter"} if device_clients else {}))
    fed = FederatedConfig(args.clients, args.per_round, args.local_steps, args.rounds, args.split, args.skew,
                          args.drop, args.late)
    resolved = config.resolved()                 # refuse bad settings before loading anything
    fed.check(resolved.n_train, resolved.batch_size)
    config.steps = fed.steps
    if args.resume and not args.checkpoint_dir:
        raise ValueError("--resume needs --checkpoint-dir (the folder of the run to continue)")
    folder = Path(args.checkpoint_dir) if args.checkpoint_dir else None
    setup = Trainer(config, progress=False)
    model = config.model or EMBEDDED
    outputs = ([("centralised", args.baseline)] if args.baseline else []) + [("federated", args.out)]
    zero_shot = zero_shot_from(args.zero_shot_from, config, model) if args.zero_shot_from else None
    device = program_client(setup, args.program) if device_clients else None
    for mode, out in outputs:
        start = time.perf_counter()
        run = FederatedRun(setup, fed, mode, folder / mode if folder else None, progress=True,
                           **({"device_method": device, "device_clients": device_clients} if mode == "federated"
                              else {}))
        result = run.run(resume=args.resume and (folder / mode / "federated.pt").is_file(), zero_shot=zero_shot)
        if zero_shot is not None and "taken_from" not in result["zero_shot"]:
            result["zero_shot"]["taken_from"] = args.zero_shot_from or f"the centralised baseline, {args.baseline}"
        zero_shot = result["zero_shot"]["test"]
        result["model"] = model
        result["provenance"] = provenance(time.perf_counter() - start, args.command_line)
        write_result(out, result)
        comm = result["communication"]
        traffic = "" if comm is None else (f"; {comm['upload_bytes_per_client_round']} bytes up and "
                                           f"{comm['download_bytes_per_client_round']} down per client a round")
        lost, late = (result["federation"].get(k) for k in ("lost_uploads", "late_uploads"))
        arrivals = (f"; {lost['lost']} of {lost['of']} uploads lost" if lost else "") + \
            (f"; {late['delayed']} of {late['of']} a round late ({late['never_arrived']} never arrived)" if late else "")
        print(f"{result['title']} {mode} ({fed.split}): {result['steps']} steps, test "
              f"{100 * result['zero_shot']['test']:.1f} -> {100 * result['final']['test']:.1f}{traffic}{arrivals} "
              f"-> {out}")
    return 0


def parse_clients(text: str | None) -> tuple[int, ...]:
    """``--device-clients 0,3`` as (0, 3); a ValueError naming what is not a client number."""
    if not text:
        return ()
    try:
        return tuple(int(k) for k in text.split(","))
    except ValueError:
        raise ValueError(f"--device-clients {text!r}: client numbers separated by commas, e.g. 0,3") from None


def zero_shot_from(path: str, config, model: str) -> float:
    """The zero-shot test score a result of this command already measured for the same task, model, seed and test
    set (B₀ = 0 for every mode and split, so it is the same number); a ValueError naming what differs."""
    import json

    record = json.loads(Path(path).read_text())
    want = {"kind": "federated", "task": config.task, "model": model, "seed": config.seed, "n_test": config.n_test,
            "layers": config.layers, "max_length": config.max_length}
    have = {**{k: record.get(k) for k in ("kind", "task", "model", "seed", "n_test")},
            **{k: record.get("config", {}).get(k) for k in ("layers", "max_length")}}
    differ = {k: (have[k], want[k]) for k in want if have[k] != want[k]}
    if differ:
        raise ValueError(f"--zero-shot-from {path}: made with other settings (file, now): {differ}")
    return record["zero_shot"]["test"]


def federate_options(p) -> None:
    from prge_lib.cli.common import add_config_options

    add_config_options(p, CONFIG_FIELDS, defaults={"q": 4, "E": 16})
    p.add_argument("--clients", type=int, default=10, help="K: clients, each with its own shard (default 10)")
    p.add_argument("--per-round", type=int, default=2, help="C: clients chosen each round (default 2)")
    p.add_argument("--local-steps", type=int, default=5, help="S: local P-RGE steps a chosen client runs (default 5)")
    p.add_argument("--rounds", type=int, default=12, help="R: rounds (default 12)")
    p.add_argument("--split", default="iid", choices=SPLITS,
                   help="iid: a random equal split; label-skew: each client's shard mostly its home label")
    p.add_argument("--skew", type=float, default=None,
                   help="label-skew: the share p of a client's examples drawn from its home label (e.g. 0.9)")
    p.add_argument("--drop", type=float, default=0.0,
                   help="the chance that a chosen client's upload is lost (drawn from the run seed, round and slot); "
                        "a round is closed on the uploads that arrived, replayed at lr over their number (default 0)")
    p.add_argument("--late", type=float, default=0.0,
                   help="the chance that an upload that is not lost comes one round late, a straggler's (drawn from "
                        "the run seed, round and slot): it is broadcast with the next round's uploads and replayed "
                        "on the newer adapter; the last round's late uploads never arrive (default 0)")
    p.add_argument("--baseline", default=None,
                   help="also write the centralised P-RGE run over the same batches, in the same order, to this file")
    p.add_argument("--zero-shot-from", default=None,
                   help="take the zero-shot test score from this earlier result of the same task, model, seed and "
                        "test set instead of measuring it again")
    p.add_argument("--checkpoint-dir", default=None,
                   help="folder of the per-round checkpoints (one subfolder per mode)")
    p.add_argument("--resume", action="store_true", help="continue the runs saved in --checkpoint-dir")
    p.add_argument("--device-clients", default=None, metavar="K[,K…]",
                   help="clients that run the exported training step of --program in the ExecuTorch runtime (the "
                        "others run eager PyTorch); their steps are also computed eagerly from the same adapter and "
                        "the result records how far apart they are; sets --noise counter for the run")
    p.add_argument("--program", default=None, help="the device clients' step (.pte, `prge export` for this run's "
                                                   "task, q, E, seed, layers and --max-length)")
    p.add_argument("--out", required=True, help="where to write the federated run's JSON result")
    p.set_defaults(run=run_federate)

