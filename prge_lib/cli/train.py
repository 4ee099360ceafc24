"""``prge zeroshot`` (a task's score without training; chapter 0) and ``prge train`` (one run of any method; chapters 1–9)."""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from pathlib import Path

from prge_lib.cli.common import add_config_options, add_model_options, note
from prge_lib.common.provenance import provenance, write_result
from prge_lib.common.settings import seed_everything
from prge_lib.data.tasks import TASKS
from prge_lib.models.options import EMBEDDED



def run_zeroshot(args) -> int:
    from prge_lib.data.splits import sample_task
    from prge_lib.training.evaluate import zero_shot
    from prge_lib.models.loading import load_model
    from prge_lib.data.tasks import get_task
    from prge_lib.training.records import zero_shot_record

    task = get_task(args.task)
    seed_everything(args.seed)
    start = time.perf_counter()
    data = sample_task(task, seed=args.seed)
    examples = data.test if args.n is None else data.test[:args.n]
    model, tokenizer = load_model(args.model, dtype=args.dtype, quant=args.quant, device=args.device)
    evaluation = zero_shot(task, model, tokenizer, examples, batch_size=args.batch_size)
    wall = time.perf_counter() - start
    output = zero_shot_record(task, examples, evaluation, model=model.name_or_path, seed=args.seed,
                              data_notes=data.notes + ([f"first {args.n} of the {len(data.test)} test examples"]
                                                       if args.n else []),
                              dtype=args.dtype, quant=args.quant)
    output["provenance"] = provenance(wall, args.command_line)
    write_result(args.out, output)
    print(f"{task.title}: {output['metric']} = {100 * output['value']:.1f}% on n = {output['n']} "
          f"({model.name_or_path}, {wall:.0f} s) -> {args.out}")
    return 0


def run_train(args) -> int:
    from prge_lib.zo.lora import save_adapter
    from prge_lib.methods import registry
    from prge_lib.training.checkpoints import CHECKPOINT_NAME, check_checkpoint_folder
    from prge_lib.training.config import TrainConfig
    from prge_lib.training.records import diverged_record, finished_record
    from prge_lib.training.stopping import stop_on_signals
    from prge_lib.training.trainer import Trainer, TrainingDiverged, TrainingStopped

    config = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                            if hasattr(args, f.name)})
    resolved = config.resolved()      # refuse bad settings before loading anything
    if resolved.engine == "fused" and resolved.device.startswith("cuda") and not resolved.cuda_graphs:
        from prge_lib.models.buckets import FINE_BUCKETS
        note("the fused step runs eagerly, one kernel launch at a time; on a GPU it is usually faster replayed as "
             f"CUDA graphs: --buckets {','.join(map(str, FINE_BUCKETS))} --cuda-graphs (the padding changes the "
             "numbers by rounding only)")
    if config.program:
        from prge_lib.deploy.export import check_program
        check_program(config.program, say=note)
    for option in ("resume", "restart"):
        if getattr(args, option) and not args.checkpoint_dir:
            raise ValueError(f"--{option} needs --checkpoint-dir (the folder of the run to continue or discard)")
    if args.checkpoint_dir:     # an existing checkpoint is continued or discarded, never overwritten unasked
        check_checkpoint_folder(Path(args.checkpoint_dir) / CHECKPOINT_NAME, args.resume, args.restart)
    start = time.perf_counter()
    if args.workers > 1:
        from prge_lib.distributed.launch import is_worker, launch
        from prge_lib.distributed.method import check_data_parallel

        check_data_parallel(resolved, args.workers)
        if not is_worker():     # the launcher: the same command in N processes (chapter 11)
            return launch(args.argv, args.workers)
        trainer = worker_trainer(config, args)
    else:
        builder = None
        if config.program:      # every step in an exported program: the runtime host builds the method
            from prge_lib.deploy.runtime import build_program_method as builder
        trainer = Trainer(config, checkpoint_dir=args.checkpoint_dir, method_builder=builder)
    model = config.model or EMBEDDED
    message = None
    # with a checkpoint folder, a first Ctrl-C or kill stops after the step with a checkpoint there (data-parallel
    # workers agree on the step: the launcher forwards the signal to each, DistributedTrainer.stop_reason)
    gentle = stop_on_signals() if args.checkpoint_dir else contextlib.nullcontext()
    try:
        with gentle:
            summary = trainer.run(resume=args.resume, restart=args.restart)
        result = finished_record(summary, model) if summary is not None else None
    except TrainingStopped as stop:
        if getattr(trainer, "rank", 0) == 0:        # rank 0 holds the checkpoint and speaks for the workers
            print(f"prge: {stop}: rerun with --resume", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        saved = trainer.checkpoint_path()
        where = f"the last checkpoint ({saved}) is kept: rerun with --resume" if saved and saved.is_file() \
            else "no checkpoint was written (use --checkpoint-dir)"
        print(f"prge: interrupted during step {trainer.step + 1}; {where}", file=sys.stderr)
        return 130
    except TrainingDiverged as err:
        # written as a grid's diverged cell is: the run as far as it went, evaluated at its last good state (every
        # data-parallel worker saw the same all-reduced loss and takes part in the summary's last replica check)
        summary = trainer.summary()
        if summary is None:         # a data-parallel worker other than rank 0: rank 0 reports it
            return 3
        message = str(err)
        result = diverged_record(summary, err, model)
    if result is None:      # a worker other than rank 0: rank 0 writes the result
        return 0
    result["provenance"] = provenance(time.perf_counter() - start, args.command_line)
    write_result(args.out, result)
    if message:
        print(f"prge: error: {message}; partial result -> {args.out}", file=sys.stderr)
        return 3
    if args.save_adapter:
        # the methods over prge_lib.zo.lora's LoRA-FA layers: those whose noise source can be chosen
        lorafa = registry.users("noise")
        if config.method not in lorafa:
            label = config.method if config.adapter == "none" else f"{config.method} --adapter {config.adapter}"
            print(f"prge: --save-adapter applies to {' and '.join(lorafa)} only; not saved for {label}",
                  file=sys.stderr)
        else:
            save_adapter(trainer.model, args.save_adapter, {"task": config.task, "method": config.method})
    best, final = result["best_val"], result["final"]
    print(f"{result['title']} {config.method}: {len(result['losses'])} steps, median "
          f"{result['step_s']['median']:.3f} s/step; test {100 * best['test']:.1f} at the best validation "
          f"step {best['step']} (val {100 * best['val']:.1f}), {100 * final['test']:.1f} at the end -> {args.out}")
    return 0


def worker_trainer(config, args):
    """This worker's trainer of a data-parallel run, in the process group the launcher described."""
    from prge_lib.distributed.trainer import DistributedTrainer
    from prge_lib.distributed.wire import init_from_env, worker_device

    config.device = worker_device(config.device)
    init_from_env(config.device)
    return DistributedTrainer(config, checkpoint_dir=args.checkpoint_dir, ddp_steps=args.ddp_steps)


def method_defaults() -> str:
    """``prge train``'s description: each registered method's defaults, and those over a peft adapter."""
    from prge_lib.methods import registry

    def listed(values) -> str:
        return ", ".join(f"{k}={v}" for k, v in values.items())

    specs = [registry.get(m) for m in registry.names()]
    return ("Defaults per method (each with its source in prge_lib.methods.registry): "
            + "; ".join(f"{s.name}: {listed(s.defaults)}" for s in specs)
            + "".join(f"; {s.name} with an adapter: {listed(s.adapter_defaults)}" for s in specs if s.adapter_defaults))


def zeroshot_options(zs) -> None:
    zs.add_argument("--task", required=True, help=f"one of: {', '.join(TASKS)}")
    zs.add_argument("--n", type=int, default=None, help="evaluate the first N test examples (default: all)")
    zs.add_argument("--seed", type=int, default=0, help="data sampling seed (default 0)")
    zs.add_argument("--batch-size", type=int, default=16)
    add_model_options(zs)
    zs.add_argument("--out", required=True, help="where to write the JSON result")
    zs.set_defaults(run=run_zeroshot)


def train_options(tr) -> None:
    add_config_options(tr)
    tr.add_argument("--checkpoint-dir", default=None, help="folder for the checkpoint (written atomically)")
    tr.add_argument("--resume", action="store_true", help="continue the run saved in --checkpoint-dir")
    tr.add_argument("--restart", action="store_true",
                    help="discard the checkpoint in --checkpoint-dir and start the run again (without --resume or "
                         "--restart, an existing checkpoint is refused)")
    tr.add_argument("--workers", type=int, default=1,
                    help="prge: train data-parallel in N processes started by torch.distributed.run (gloo on the "
                         "CPU, NCCL on GPUs), the q queries of a step split over them (N ≤ q) and only q + 1 floats "
                         "a step exchanged; rank 0 evaluates, checkpoints and writes the result (chapter 11)")
    tr.add_argument("--ddp-steps", type=int, default=2,
                    help="with --workers: passes of first-order DDP (LoRA-FA and full model) whose gradient "
                         "all-reduce bytes the result records beside P-RGE's (0: none)")
    tr.add_argument("--save-adapter", default=None, help="write the trained LoRA-FA adapter (safetensors)")
    tr.add_argument("--out", required=True, help="where to write the JSON result")
    tr.set_defaults(run=run_train)
