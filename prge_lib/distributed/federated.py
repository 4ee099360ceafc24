"""Federated P-RGE (chapter 11): K clients, each with its own shard of the training sample
(:mod:`prge_lib.distributed.shards`), C of them chosen each round; a chosen client starts from the global adapter,
runs S local P-RGE steps (ZO-SGD, Gao et al. Alg. 1) on batches of its shard and uploads only its steps' seed
indices and projected gradients (:mod:`prge_lib.distributed.upload`). The server aggregates by replay alone
(FedAvg of the client deltas):

    B ← B + (1/C) Σ_c Σ_s Δ_c,s,      Δ_c,s = −(η/q) Σ_i g_c,s,i z(s_c,s,i)

applied client by client, step by step, in the order of the round's uploads (:func:`apply_broadcast`); every client
that receives the round's broadcast applies the same function to the same bytes and holds the same adapter, bit
for bit. The seed schedule is the only shared state: the step of round r, client slot c (its place among the round's
chosen clients, in increasing id), local step s has seed index t = (r·C + c)·S + s and seeds step_seeds(run seed,
t, q), unique per (round, client, local step).

The clients are simulated in one process, one after another: the model is loaded once and only the adapter is
swapped (a client's local steps start from a copy of the global B). The computing cost is the local steps; replay
draws noise and adds, with no forward. The centralised baseline (``mode="centralised"``) runs single-process P-RGE
over exactly the batches the clients used, in the order they used them, with the same seed indices, steps and
learning rate: only the federation differs. With C = 1 and S = 1 the two are the same computation (each round one
step from the global adapter, applied at η/1) and end bit-identical (tests/test_federated.py).

A client can also be an ExecuTorch program (``device_clients`` with ``device_method``: the exported step of chapter
10 on the Python host, :func:`prge_lib.deploy.client.program_client`): from the global adapter it trains its local steps in
the runtime and uploads their g like any client; the server and the other clients replay them eagerly. Its g come
from the runtime's forward and noise, so each of its steps is also computed by an eager twin from the same
adapter, and the round records how far apart the two are (the paper's parity check, §4.3: relative loss
difference, and the largest g difference). What the device client holds after a round is the broadcast replayed
on the host, like every client; an exported update-only program that would replay it on the device is not built.

A run checkpoints after every round (the global adapter, the round index, the broadcasts so far); resumed, it goes
on as the uninterrupted run would, since every choice is a function of (run seed, round).
"""
from __future__ import annotations

import dataclasses
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from prge_lib.common.provenance import atomic_file
from prge_lib.distributed.upload import Upload, decode_broadcast, encode_broadcast
from prge_lib.zo.replay import adapter_digest, replay_steps
from prge_lib.distributed.shards import SPLITS, check_split, label_counts, make_shards, shard_sizes
from prge_lib.training.records import SCHEMA_VERSION, step_times
from prge_lib.training.trainer import Trainer, TrainingDiverged
from prge_lib.zo.prge import PRGE
from prge_lib.zo.rge import mix_seed

MODES = ("federated", "centralised")
CHECKPOINT_NAME = "federated.pt"
_CHOICE_TAG, _ORDER_TAG, _DROP_TAG, _LATE_TAG = 0xFED, 0xC11E, 0xD209, 0x1A7E   # clients; data order; losses; delays


@dataclass(frozen=True)
class FederatedConfig:
    """The federation's settings (K clients, C a round, S local steps, R rounds, the split and its skew p, the
    chance ``drop`` that a chosen client's upload never arrives, and the chance ``late`` that an upload that does
    arrive comes one round late, a straggler's)."""
    clients: int = 10
    per_round: int = 2
    local_steps: int = 5
    rounds: int = 12
    split: str = "iid"
    skew: float | None = None
    drop: float = 0.0
    late: float = 0.0

    def check(self, n_train: int, batch_size: int) -> None:
        """Refuse settings that cannot run, naming the value and what is allowed."""
        for name in ("clients", "per_round", "local_steps", "rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be at least 1")
        if self.per_round > self.clients:
            raise ValueError(f"--per-round {self.per_round}: at most --clients ({self.clients}) clients a round")
        if not 0 <= self.drop < 1:
            raise ValueError(f"--drop {self.drop}: the chance that an upload is lost, at least 0 and below 1")
        if not 0 <= self.late < 1:
            raise ValueError(f"--late {self.late}: the chance that an upload comes a round late, at least 0 and "
                             "below 1")
        check_split(self.split, self.clients, n_train, self.skew)
        smallest = min(shard_sizes(n_train, self.clients))
        if smallest < batch_size:
            raise ValueError(f"--clients {self.clients}: shards of {smallest} of the {n_train} training examples "
                             f"cannot fill a batch of {batch_size}; use at most {n_train // batch_size} clients")

    @property
    def steps(self) -> int:
        return self.rounds * self.per_round * self.local_steps


def round_clients(seed: int, r: int, clients: int, per_round: int) -> list[int]:
    """The clients of round ``r``: ``per_round`` of ``clients`` drawn from (run seed, r), in increasing id."""
    return sorted(random.Random(mix_seed(seed, _CHOICE_TAG, r)).sample(range(clients), per_round))


def _happens(chance: float, *key: int) -> bool:
    """A seeded draw from ``key`` (run seed, tag, round, slot) below ``chance``; never, at chance 0."""
    return chance > 0 and random.Random(mix_seed(*key)).random() < chance


def upload_lost(seed: int, r: int, slot: int, drop: float) -> bool:
    """Whether the upload of slot ``slot`` of round ``r`` is lost: a draw from (run seed, r, slot) below ``drop``
    (the client trained, and its message never reached the server)."""
    return _happens(drop, seed, _DROP_TAG, r, slot)


def upload_late(seed: int, r: int, slot: int, late: float) -> bool:
    """Whether the upload of slot ``slot`` of round ``r`` reaches the server one round late: a draw from (run
    seed, r, slot), apart from the draw of :func:`upload_lost`, below ``late`` (a straggler: the server closes
    round r without it and broadcasts it with round r + 1's uploads)."""
    return _happens(late, seed, _LATE_TAG, r, slot)


def seed_index(fed: FederatedConfig, r: int, slot: int, s: int) -> int:
    """The step index t whose seeds step_seeds(run seed, t, q) local step ``s`` of slot ``slot`` of round ``r``
    draws: unique per (round, client, local step)."""
    return (r * fed.per_round + slot) * fed.local_steps + s


def client_batch(seed: int, client: int, shard: list[int], j: int, batch_size: int) -> list[int]:
    """The examples of a client's ``j``-th local step: its shard in a seeded order per epoch, as the trainer
    walks the whole sample (a last partial batch dropped)."""
    epoch, offset = divmod(j * batch_size, len(shard) - len(shard) % batch_size)
    order = random.Random(mix_seed(seed, _ORDER_TAG, client, epoch)).sample(shard, len(shard))
    return order[offset:offset + batch_size]


def plan(seed: int, fed: FederatedConfig, shards: list[list[int]], batch_size: int) -> list[list[tuple]]:
    """Every round's work: per chosen client (client, [(seed index t, example indices) per local step])."""
    done = [0] * fed.clients         # local steps each client has taken so far
    rounds = []
    for r in range(fed.rounds):
        work = []
        for slot, k in enumerate(round_clients(seed, r, fed.clients, fed.per_round)):
            steps = [(seed_index(fed, r, slot, s), client_batch(seed, k, shards[k], done[k] + s, batch_size))
                     for s in range(fed.local_steps)]
            done[k] += fed.local_steps
            work.append((k, steps))
        rounds.append(work)
    return rounds


def apply_broadcast(method: PRGE, broadcast: bytes, replay: Callable = replay_steps) -> list[Upload]:
    """What the server and every client do with a round's broadcast: replay each upload's steps, in order, at
    η/n for the n uploads it holds (FedAvg of the deltas that arrived: n = C when none was lost or late, and a
    late upload of the round before counts as one of them; a round whose uploads were all lost leaves the adapter
    as it was); returns the uploads. ``replay``: what applies the steps, called like
    :func:`prge_lib.zo.replay.replay_steps` (a device's runtime: ``prge_lib.deploy.client.ProgramReplayer``)."""
    _, uploads = decode_broadcast(broadcast)
    if uploads:
        replay(method, ((t, g) for u in uploads for t, g in u.steps), method.lr / len(uploads))
    return uploads


def device_parity(client: int, pairs: list, losses: list[float], twin_pairs: list, twin_losses: list[float]) -> dict:
    """A device client's steps against its eager twin's from the same adapter: the largest relative difference of
    the step losses (the paper's check, within 1e-4 passes) and of the g."""
    rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, twin_losses, strict=True)]
    g_gap = [abs(a - b) for (_, ga), (_, gb) in zip(pairs, twin_pairs, strict=True) for a, b in zip(ga, gb)]
    return {"client": client, "steps": len(rel), "max_rel_loss_diff": max(rel), "max_abs_g_diff": max(g_gap),
            "within_1e-4": max(rel) <= 1e-4}


def adapter_bytes(method: PRGE) -> int:
    """Bytes of the adapter as float32 numbers, serialized: what a first-order FedAvg client uploads a round
    (its delta, one number per trainable parameter)."""
    return len(b"".join(b.detach().cpu().contiguous().numpy().tobytes() for b in method.trainable().values()))


class FederatedRun:
    """One federated (or centralised) run on ``setup``'s model, data and P-RGE method (a :class:`Trainer` built for
    the run's config, used for its data, batches and evaluation; its adapter is reset to B₀ = 0 here, so one setup
    serves several runs in turn). ``test``: the examples scored before and after training."""

    def __init__(self, setup: Trainer, fed: FederatedConfig, mode: str = "federated",
                 checkpoint_dir: str | Path | None = None, progress: bool = True, test: list | None = None,
                 device_method: PRGE | None = None, device_clients: tuple[int, ...] = ()):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {list(MODES)}")
        if not isinstance(setup.method, PRGE) or setup.config.engine != "layerwise":
            raise ValueError(f"federated rounds replay layerwise P-RGE steps (prge, mezo-lorafa), not "
                             f"{setup.config.method} with engine {setup.config.engine!r}")
        c = setup.config
        fed.check(len(setup.items), c.batch_size)
        self.setup, self.fed, self.mode, self.progress = setup, fed, mode, progress
        self.method: PRGE = setup.method
        self.test = setup.data.test if test is None else test
        self.labels = [setup.task.gold(ex) for ex in setup.data.train]
        self.shards = make_shards(fed.split, self.labels, fed.clients, c.seed, fed.skew)
        self.plan = plan(c.seed, fed, self.shards, c.batch_size)
        self.checkpoint = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir else None
        self.device_clients, self.device_method = tuple(sorted(set(device_clients))), device_method
        if self.device_clients:
            if mode != "federated":
                raise ValueError("device clients take part in federated rounds; the centralised baseline has none")
            if device_method is None:
                raise ValueError("device clients need the method they run (prge_lib.deploy.client.program_client)")
            outside = [k for k in self.device_clients if not 0 <= k < fed.clients]
            if outside:
                raise ValueError(f"--device-clients {outside[0]}: clients are numbered 0 to {fed.clients - 1}")

    def identity(self) -> dict:
        """What a checkpoint must agree on to be resumed."""
        fed = {k: v for k, v in dataclasses.asdict(self.fed).items()
               if k not in ("drop", "late") or v}                    # older checkpoints have neither
        return {**self.setup.config.identity(), **fed, "mode": self.mode,
                "n_test": len(self.test),
                **({"device_clients": list(self.device_clients)} if self.device_clients else {})}

    # ----- state
    def reset(self) -> None:
        with torch.no_grad():
            for b in self.method.trainable().values():
                b.zero_()
        self.round, self.broadcasts, self.rounds, self.zero_shot, self.resumed = 0, [], [], None, []
        self.pending: list[bytes] = []        # late uploads of the last round, broadcast with the next round's
        self.elapsed = {"train_s": 0.0, "eval_s": 0.0}

    def save(self) -> None:
        if self.checkpoint is None:
            return
        payload = {"identity": self.identity(), "round": self.round, "rounds": self.rounds,
                   "adapter": {k: v.detach().cpu().clone() for k, v in self.method.trainable().items()},
                   "broadcasts": [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in self.broadcasts],
                   "pending": [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in self.pending],
                   "zero_shot": self.zero_shot, "elapsed": self.elapsed, "resumed": self.resumed}
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(self.checkpoint) as tmp:
            torch.save(payload, tmp)

    def load(self) -> None:
        if self.checkpoint is None or not self.checkpoint.is_file():
            raise FileNotFoundError(f"--resume: no checkpoint at {self.checkpoint}")
        payload = torch.load(self.checkpoint, weights_only=True)
        saved, now = payload["identity"], self.identity()
        differ = {k: (saved.get(k), now[k]) for k in now if saved.get(k) != now[k]}
        if differ:
            raise ValueError(f"the checkpoint {self.checkpoint} was made with other settings (saved, now): {differ}")
        with torch.no_grad():
            for name, tensor in self.method.trainable().items():
                tensor.copy_(payload["adapter"][name])
        self.round, self.rounds, self.zero_shot = payload["round"], payload["rounds"], payload["zero_shot"]
        self.broadcasts = [bytes(t.numpy().tobytes()) for t in payload["broadcasts"]]
        self.pending = [bytes(t.numpy().tobytes()) for t in payload.get("pending", [])]
        self.elapsed, self.resumed = payload["elapsed"], payload["resumed"] + [self.round]

    def evaluate(self) -> float:
        start = time.perf_counter()
        value = self.setup.evaluate(self.test)
        self.elapsed["eval_s"] += time.perf_counter() - start
        return value

    # ----- a round
    def local_steps(self, steps: list[tuple[int, list[int]]], method: PRGE | None = None
                    ) -> tuple[list, list[float], list[float]]:
        """P-RGE steps of ``method`` (default: the eager one) from the adapter as it is: the (t, g) pairs, the
        losses and the seconds of each."""
        method = method or self.method
        pairs, losses, seconds = [], [], []
        for t, indices in steps:
            start = time.perf_counter()
            record = method.step(self.setup.batch_of(indices), t)
            seconds.append(time.perf_counter() - start)
            if not record["finite"]:
                raise TrainingDiverged(f"round {self.round + 1}, seed index {t}: the loss is {record['loss']} "
                                       f"(not finite); lower the learning rate (now {self.method.lr}) or ε")
            pairs.append((t, tuple(record["projected_grad"])))
            losses.append(record["loss"])
        return pairs, losses, seconds

    def run_round(self, r: int) -> dict:
        work, losses, seconds, uploads = self.plan[r], [], [], []
        if self.mode == "centralised":
            steps = []
            for _, client_steps in work:
                pairs, l, s = self.local_steps(client_steps)
                steps += pairs
                losses, seconds = losses + l, seconds + s
            return {"round": r, "clients": [k for k, _ in work], "loss": statistics.fmean(losses),
                    "losses": losses, "step_s": seconds, "steps": [[t, list(g)] for t, g in steps]}
        start_b = {k: v.detach().clone() for k, v in self.method.trainable().items()}
        device, lost, late = [], [], []
        uploads, self.pending = list(self.pending), []       # last round's stragglers arrive first
        for slot, (k, client_steps) in enumerate(work):
            self._load(start_b)                        # every client starts from the global adapter
            if k in self.device_clients:
                pairs, l, s = self.local_steps(client_steps, self.device_method)
                self._load(start_b)                    # its eager twin, from the same adapter
                device.append(device_parity(k, pairs, l, *self.local_steps(client_steps)[:2]))
            else:
                pairs, l, s = self.local_steps(client_steps)
            losses, seconds = losses + l, seconds + s
            message = Upload(k, r, tuple(pairs)).to_bytes()
            if upload_lost(self.setup.config.seed, r, slot, self.fed.drop):
                lost.append(k)                         # trained, but the server never hears of it
            elif upload_late(self.setup.config.seed, r, slot, self.fed.late):
                late.append(k)                         # arrives after the round closed: sent with the next one
                self.pending.append(message)
            else:
                uploads.append(message)
        with torch.no_grad():
            for name, tensor in self.method.trainable().items():
                tensor.copy_(start_b[name])
        broadcast = encode_broadcast(r, uploads)
        apply_broadcast(self.method, broadcast)
        self.broadcasts.append(broadcast)
        return {"round": r, "clients": [k for k, _ in work], "loss": statistics.fmean(losses), "losses": losses,
                "step_s": seconds, "upload_bytes": [len(u) for u in uploads], "broadcast_bytes": len(broadcast),
                **({"device": device} if device else {}), **({"lost": lost} if self.fed.drop else {}),
                **({"late": late} if self.fed.late else {})}

    def _load(self, adapter: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, tensor in self.method.trainable().items():
                tensor.copy_(adapter[name])

    # ----- the run
    def run(self, resume: bool = False, zero_shot: float | None = None) -> dict:
        """Train every round (from the checkpoint with ``resume``) and return the result. ``zero_shot``: the
        test score at B₀ = 0 when already measured for this model, seed and test set (it is the same for every
        mode and split); else it is measured here."""
        self.reset()
        if resume:
            self.load()
        if self.zero_shot is None:
            self.zero_shot = self.evaluate() if zero_shot is None else zero_shot
        bar = tqdm(total=self.fed.rounds, initial=self.round, desc=f"{self.mode} {self.fed.split}",
                   disable=not self.progress)
        while self.round < self.fed.rounds:
            start = time.perf_counter()
            record = self.run_round(self.round)
            self.elapsed["train_s"] += time.perf_counter() - start
            self.rounds.append(record)
            self.round += 1
            self.save()
            bar.set_postfix(loss=f"{record['loss']:.3f}")
            bar.update(1)
        bar.close()
        return self.summary(self.evaluate())

    def summary(self, final: float) -> dict:
        """The result (:class:`prge_lib.training.records.FederatedRecord`, without provenance)."""
        s, c, fed = self.setup, self.setup.config, self.fed
        losses = [x for r in self.rounds for x in r["losses"]]
        record = {
            "kind": "federated", "schema_version": SCHEMA_VERSION, "mode": self.mode, "task": s.task.name,
            "title": s.task.title, "metric": s.task.metric, "seed": c.seed,
            "config": {**dataclasses.asdict(c), **dataclasses.asdict(fed)},
            "federation": {"clients": fed.clients, "per_round": fed.per_round, "local_steps": fed.local_steps,
                           "rounds": fed.rounds, "split": fed.split, "skew": fed.skew,
                           "shard_sizes": [len(x) for x in self.shards],
                           "label_counts": label_counts(self.shards, self.labels),
                           "clients_by_round": [r["clients"] for r in self.rounds],
                           "simulated": "clients run one after another in one process, the model loaded once"},
            "steps": len(losses), "examples": len(losses) * c.batch_size, "n_test": len(self.test),
            "zero_shot": {"test": self.zero_shot}, "final": {"test": final},
            "round_losses": [r["loss"] for r in self.rounds], "losses": losses,
            "step_s": step_times([x for r in self.rounds for x in r["step_s"]], 5, statistics.median_high),
            "elapsed_s": {k: round(v, 2) for k, v in self.elapsed.items()},
            "resumed_at_rounds": self.resumed, "adapter_sha256": adapter_digest(self.method.trainable()),
            "trainable_parameters": sum(p.numel() for p in self.method.trainable().values()),
            "data_sizes": s.data.sizes(), "data_notes": s.data.notes,
        }
        if self.mode == "centralised":
            record["projected_grad"] = [step for r in self.rounds for step in r["steps"]]
            record["communication"] = None
            return record
        upload = sorted({b for r in self.rounds for b in r["upload_bytes"]})
        download = sorted({r["broadcast_bytes"] for r in self.rounds})
        total_up = sum(b for r in self.rounds for b in r["upload_bytes"])
        total_down = fed.clients * sum(r["broadcast_bytes"] for r in self.rounds)
        record["communication"] = {
            "upload_bytes_per_client_round": upload[0] if len(upload) == 1 else upload,
            "download_bytes_per_client_round": download[0] if len(download) == 1 else download,
            "total": {"upload": total_up, "download": total_down, "all": total_up + total_down},
            "first_order_fedavg_upload_bytes_per_client_round": adapter_bytes(self.method),
            "counted": "len(bytes) of each serialized upload and broadcast (prge_lib.distributed.upload); "
                       "every one of the K clients receives every broadcast; the first-order figure is the "
                       "adapter's float32 bytes, the delta a first-order FedAvg client would upload",
        }
        record["uploads"] = [{"round": r["round"], "clients": r["clients"], "upload_bytes": r["upload_bytes"],
                              "broadcast_bytes": r["broadcast_bytes"],
                              **{k: r[k] for k in ("lost", "late") if k in r}} for r in self.rounds]
        if fed.drop:
            lost = [len(r["lost"]) for r in self.rounds]
            record["federation"]["lost_uploads"] = {
                "drop": fed.drop, "lost": sum(lost), "of": len(lost) * fed.per_round,
                "rounds_with_none_arrived": sum(n == fed.per_round for n in lost),
                "how": "a chosen client trains and its upload is lost with chance drop (drawn from run seed, round "
                       "and slot); the round is closed on the uploads that arrived, replayed at lr/(their number)"}
        if fed.late:
            late = [len(r["late"]) for r in self.rounds]
            record["federation"]["late_uploads"] = {
                "late": fed.late, "delayed": sum(late), "of": len(late) * fed.per_round,
                "never_arrived": len(self.pending),
                "how": "an upload that is not lost comes one round late with chance late (drawn from run seed, round "
                       "and slot apart from the loss): the server closes the round without it and broadcasts it "
                       "with the next round's uploads, replayed on the newer adapter at lr/(that broadcast's number "
                       "of uploads); the last round's late uploads never arrive"}
        if self.device_clients:
            checks = [d for r in self.rounds for d in r.get("device", [])]
            record["federation"]["device_clients"] = {
                "clients": list(self.device_clients),
                "program": Path(getattr(self.device_method, "path", "")).name or None,
                "rounds": [{"round": r["round"], **d} for r in self.rounds for d in r.get("device", [])],
                "max_rel_loss_diff": max((d["max_rel_loss_diff"] for d in checks), default=None),
                "max_abs_g_diff": max((d["max_abs_g_diff"] for d in checks), default=None),
                "how": "each device step also computed by an eager twin from the same adapter; the server and "
                       "every client replay the device's g eagerly"}
        return record
