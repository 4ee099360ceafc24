"""The native host (chapter 10): the C++ trainer in ``prge_lib/deploy/native/trainer.cpp``, built against the C++ SDK that
the executorch wheel ships, on this machine ("native") or cross-built for 64-bit Arm and run under qemu
("native-aarch64"), and the Python side that feeds it (``prge device-train --host native``).

The Python side prepares every step exactly as the Python host does (data order, batch fitted to the program's
width, seeds; :meth:`prge_lib.deploy.runtime.ProgramPRGE.feed`) and writes them to a batch file; the C++ trainer runs the
steps, threading the adapter through the program, and writes a step log and the adapter file. The adapter is then
loaded into the eager model for evaluation and saving, as after the Python host's run.

Files (little-endian), read by trainer.cpp:
  batch file    "PRGEBAT1", int64 first_step, steps, rows, width, target_width, q, adapter_size; per step: int64
                step, input_ids, attention_mask (rows × width), targets (rows × target_width), seeds (q); float32
                lr, eps
  adapter file  "PRGEADP1", int64 step (steps done), int64 size, float32 adapter[size]
  step log      one tab-separated line per step: step, kept (1/0), seconds, the 2q losses (+ε row, then −ε)
"""
from __future__ import annotations

import functools
import hashlib
import json
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from importlib import metadata
from pathlib import Path

import torch

from prge_lib.common.paths import NATIVE_SOURCE
from prge_lib.common.settings import cache_dir
from prge_lib.common.provenance import atomic_file
from prge_lib.deploy.runtime import build_program_method, step_record
from prge_lib.training.config import TrainConfig
from prge_lib.training.trainer import Trainer, TrainingDiverged

SOURCE = NATIVE_SOURCE
TARGETS = ("native", "native-aarch64")
SYSROOT = Path("/usr/aarch64-linux-gnu")          # Debian's aarch64 libraries, installed with the cross compiler
AARCH64_WHEEL = "manylinux_2_28_aarch64"
BATCH_MAGIC, ADAPTER_MAGIC = b"PRGEBAT1", b"PRGEADP1"
# the programs each target needs, and the Debian package that provides each
TOOLS = {"native": {"cmake": "cmake", "g++": "g++"},
         "native-aarch64": {"cmake": "cmake", "aarch64-linux-gnu-g++": "g++-aarch64-linux-gnu",
                            "qemu-aarch64-static": "qemu-user-static"}}


class NativeHostError(RuntimeError):
    """A one-line failure of the native host: a missing tool, a failed build, or the trainer's own message."""


def source_part(name: str) -> str:
    """The part of trainer.cpp that starts at its ``// ## name`` line, up to the next such line (the chapter
    shows the C++ loop piece by piece from the file itself)."""
    lines = (SOURCE / "trainer.cpp").read_text().splitlines()
    marks = [i for i, line in enumerate(lines) if line.lstrip().startswith("// ## ")]
    starts = [i for i in marks if lines[i].strip() == f"// ## {name}"]
    if not starts:
        raise KeyError(f"trainer.cpp has no part {name!r}; parts: {[lines[i].strip()[6:] for i in marks]}")
    end = next((i for i in marks if i > starts[0]), len(lines))
    part = lines[starts[0] + 1:end]
    while part and (not part[-1].strip() or part[-1].startswith("}  // namespace")):
        part.pop()
    return textwrap.dedent("\n".join(part))


# ----- the files between the two sides

def write_batches(path, first_step: int, steps: list[tuple]) -> Path:
    """Write the inputs of steps ``first_step``, ``first_step + 1``, … (each the program's seven inputs, as
    :meth:`ProgramPRGE.feed` returns them; the adapter is only sized, it travels in the adapter file)."""
    if not steps:
        raise ValueError("no steps to write")
    ids, _, targets, adapter, seeds, _, _ = steps[0]
    shape = (*ids.shape, targets.shape[1], seeds.numel(), adapter.numel())
    with atomic_file(path) as tmp, open(tmp, "wb") as f:
        f.write(BATCH_MAGIC + struct.pack("<7q", first_step, len(steps), *shape))
        for t, (ids, mask, targets, adapter, seeds, lr, eps) in enumerate(steps, first_step):
            if (*ids.shape, targets.shape[1], seeds.numel(), adapter.numel()) != shape or mask.shape != ids.shape:
                raise ValueError(f"step {t} has other shapes than step {first_step}; a program's shapes are fixed")
            f.write(struct.pack("<q", t))
            for part in (ids, mask, targets, seeds):
                f.write(part.to(torch.int64).contiguous().numpy().astype("<i8").tobytes())
            f.write(struct.pack("<2f", float(lr), float(eps)))
    return Path(path)


def write_adapter(path, adapter: torch.Tensor, step: int) -> Path:
    """The adapter file: the flattened LoRA-B (``TrainStep.adapter()``) and the number of steps done."""
    data = adapter.detach().to(torch.float32).contiguous().numpy().astype("<f4")
    with atomic_file(path) as tmp:
        tmp.write_bytes(ADAPTER_MAGIC + struct.pack("<2q", step, data.size) + data.tobytes())
    return Path(path)


def read_adapter(path) -> tuple[int, torch.Tensor]:
    """(steps done, adapter) from an adapter file written by the C++ trainer or :func:`write_adapter`."""
    raw = Path(path).read_bytes()
    if raw[:8] != ADAPTER_MAGIC or len(raw) < 24:
        raise NativeHostError(f"{path}: not an adapter file (no PRGEADP1 header)")
    step, size = struct.unpack("<2q", raw[8:24])
    if len(raw) != 24 + 4 * size:
        raise NativeHostError(f"{path}: {len(raw)} bytes, not the {24 + 4 * size} of an adapter of {size} floats")
    return step, torch.frombuffer(bytearray(raw[24:]), dtype=torch.float32)


def read_step_log(path, q: int) -> dict[int, dict]:
    """The step log as {step: {"kept", "seconds", "losses" (2, q)}}; a step logged twice (a run continued
    from an earlier adapter) keeps its last line."""
    steps = {}
    for line in Path(path).read_text().splitlines():
        fields = line.split("\t")
        if len(fields) != 3 + 2 * q:
            raise NativeHostError(f"{path}: a line of {len(fields)} fields, not {3 + 2 * q}: {line[:60]!r}")
        steps[int(fields[0])] = {"kept": fields[1] == "1", "seconds": float(fields[2]),
                                 "losses": torch.tensor([float(v) for v in fields[3:]]).reshape(2, q)}
    return steps


# ----- building the trainer

def check_tools(target: str) -> None:
    """Refuse, in one line, a target whose compiler, build tool or emulator is missing, naming the Debian
    package that provides it."""
    if target not in TARGETS:
        raise ValueError(f"unknown native target {target!r}; choose one of {list(TARGETS)}")
    for program, package in TOOLS[target].items():
        if shutil.which(program) is None:
            raise NativeHostError(f"{program} is missing, needed for --host {target}: install the Debian package "
                                  f"{package} (apt-get install {package})")
    if target == "native-aarch64" and not (SYSROOT / "lib").is_dir():
        raise NativeHostError(f"the aarch64 libraries are missing ({SYSROOT}/lib): install the Debian package "
                              f"g++-aarch64-linux-gnu (apt-get install g++-aarch64-linux-gnu)")


def executorch_version() -> str:
    return metadata.version("executorch")


def sdk_root(target: str) -> Path:
    """The executorch package whose C++ SDK (include/, lib/, share/cmake/) the trainer builds against: the
    installed wheel's for "native", the aarch64 wheel's of the same version for "native-aarch64"."""
    if target == "native-aarch64":
        return aarch64_sdk()
    import executorch

    root = Path(list(executorch.__path__)[0])
    if not (root / "share" / "cmake" / "executorch-config.cmake").is_file():
        raise NativeHostError(f"the installed executorch {executorch_version()} ships no C++ SDK ({root}/share/cmake "
                              f"is missing); install the wheel the project pins (pip install executorch==1.5.1)")
    return root


def aarch64_sdk() -> Path:
    """The C++ SDK of the aarch64 executorch wheel of the installed version, downloaded once with pip and kept in
    the cache folder (only its include/, lib/ and share/ folders)."""
    version = executorch_version()
    folder = cache_dir() / "native" / f"executorch-{version}-aarch64"
    root = folder / "executorch"
    if (root / "share" / "cmake" / "executorch-config.cmake").is_file():
        return root
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        # the C++ SDK in the wheel is the same for every Python version; 3.11 is one the release covers
        command = [sys.executable, "-m", "pip", "download", f"executorch=={version}", "--platform", AARCH64_WHEEL,
                   "--only-binary=:all:", "--no-deps", "--python-version", "3.11", "--quiet", "--dest", tmp]
        proc = subprocess.run(command, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("executorch-*.whl"))
        if proc.returncode != 0 or not wheels:
            last = (proc.stderr.strip().splitlines() or ["no wheel was written"])[-1]
            raise NativeHostError(f"downloading the aarch64 wheel of executorch {version} failed ({last}); it needs "
                                  f"the package index: run `{' '.join(command[:-2])} --dest DIR` where it is reachable")
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(Path(tmp) / "sdk", [n for n in wheel.namelist()
                                                 if n.split("/")[:2] in (["executorch", "include"],
                                                                         ["executorch", "lib"],
                                                                         ["executorch", "share"])])
        shutil.rmtree(folder, ignore_errors=True)
        folder.parent.mkdir(parents=True, exist_ok=True)
        (Path(tmp) / "sdk").rename(folder)
    return root


def build_trainer(target: str) -> Path:
    """Build trainer.cpp for ``target`` with CMake, once: the binary is kept in the cache folder under a key of
    the sources, the target and the SDK, and rebuilt only when one of them changes."""
    check_tools(target)
    sdk = sdk_root(target)
    sources = [SOURCE / name for name in ("trainer.cpp", "CMakeLists.txt", "aarch64.cmake")]
    key = hashlib.sha256(b"".join(p.read_bytes() for p in sources)
                         + f"{target} {executorch_version()} {sdk}".encode()).hexdigest()[:12]
    folder = cache_dir() / "native" / f"build-{target}-{key}"
    binary = folder / "prge-trainer"
    if binary.is_file():
        return binary
    folder.parent.mkdir(parents=True, exist_ok=True)
    # each build works in a folder of its own, so two processes building at once never share a CMake tree
    work = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f"{folder.name}.building-"))
    configure = ["cmake", "-S", str(SOURCE), "-B", str(work), "-DCMAKE_BUILD_TYPE=Release",
                 f"-Dexecutorch_DIR={sdk / 'share' / 'cmake'}"]
    if target == "native-aarch64":
        configure.append(f"-DCMAKE_TOOLCHAIN_FILE={SOURCE / 'aarch64.cmake'}")
    for step in (configure, ["cmake", "--build", str(work), "-j", "2"]):
        proc = subprocess.run(step, capture_output=True, text=True)
        if proc.returncode != 0:
            log = work / "failed.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(proc.stdout + proc.stderr)
            first = next((line for line in (proc.stdout + proc.stderr).splitlines() if "error" in line.lower()),
                         f"exit status {proc.returncode}")
            raise NativeHostError(f"building the C++ trainer for {target} failed: {first.strip()} (log: {log})")
    if folder.is_dir() and not binary.is_file():     # a stale folder (a build renamed in whole always has it)
        shutil.rmtree(folder, ignore_errors=True)
    try:
        work.rename(folder)
    except OSError:                 # another process finished the same build first: use its binary
        shutil.rmtree(work, ignore_errors=True)
        if not binary.is_file():
            raise
        return binary
    for old in folder.parent.glob(f"build-{target}-*"):        # builds of earlier sources
        if old != folder and ".building-" not in old.name and old.name.rsplit("-", 1)[0] == f"build-{target}":
            shutil.rmtree(old, ignore_errors=True)
    return binary


def trainer_command(target: str, binary: Path) -> list[str]:
    """How to start the built trainer: directly, or under qemu with Debian's aarch64 libraries."""
    if target == "native-aarch64":
        return ["qemu-aarch64-static", "-L", str(SYSROOT), str(binary)]
    return [str(binary)]


def run_trainer(target: str, binary: Path, pte, batches, adapter, log, save_every: int = 0) -> dict:
    """Run the C++ trainer ``binary`` (from :func:`build_trainer`) once over a batch file; returns the summary it
    prints (load time, resident memory).
    A refused non-finite step raises :class:`prge_lib.training.trainer.TrainingDiverged`, any other failure
    :class:`NativeHostError`, both with the trainer's one-line message."""
    command = trainer_command(target, binary) + [str(pte), str(batches), str(adapter), str(log)]
    if save_every:
        command += ["--save-every", str(save_every)]
    proc = subprocess.run(command, capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    message = lines[-1] if lines else f"the trainer stopped with exit status {proc.returncode}"
    if proc.returncode == 3:
        raise TrainingDiverged(message)
    if proc.returncode != 0:
        raise NativeHostError(message)
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----- the host above the C++ trainer

class NativeTrainer:
    """``prge device-train --host native`` / ``native-aarch64``: the trainer of chapter 5 prepares the steps, the
    C++ trainer runs them. It has the interface ``train_in_runtime`` uses of ``prge_lib.training.trainer.Trainer``:
    ``run(resume)`` returns the same result record, ``model`` holds the trained adapter, ``host_record()``.

    The steps run in chunks that end at each evaluation point; between chunks the adapter crosses over in the
    adapter file, so a chunk is the C++ trainer continuing from a saved adapter and step. ``checkpoint_dir`` keeps
    the batch file, the adapter file (saved every ``checkpoint_every`` steps), the step log and the evaluations,
    and ``run(resume=True)`` continues from them. ``progress``: a line on stderr after each chunk."""

    def __init__(self, config: TrainConfig, target: str, checkpoint_dir=None, progress: bool = True):
        self.binary = build_trainer(target)              # a missing tool or a failed build stops us before any work
        self.target, self.progress = target, progress
        self.trainer = Trainer(config, progress=False, method_builder=functools.partial(build_program_method,
                                                                                        load=False))
        self.method, self.model = self.trainer.method, self.trainer.model
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.summaries: list[dict] = []

    def run(self, resume: bool = False, restart: bool = False) -> dict:
        """Run the steps; ``resume`` continues the run in the checkpoint folder, ``restart`` discards it (with
        neither, a folder holding a run's adapter file is refused)."""
        if self.checkpoint_dir is None:
            if resume:
                raise ValueError("resume needs a checkpoint folder")
            with tempfile.TemporaryDirectory() as folder:
                return self._run(Path(folder), False)
        if resume and restart:
            raise ValueError("--resume continues the saved run and --restart discards it: give one of them")
        adapter = self.checkpoint_dir / "adapter.bin"
        if not resume and not restart and adapter.is_file():
            raise ValueError(f"{self.checkpoint_dir} already holds a native run at step {read_adapter(adapter)[0]}: "
                             f"continue it with --resume, or discard it with --restart")
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        return self._run(self.checkpoint_dir, resume)

    def _run(self, folder: Path, resume: bool) -> dict:
        tr, c = self.trainer, self.trainer.config
        files = {name: folder / name for name in ("batches.bin", "adapter.bin", "steps.tsv", "host.json")}
        if resume:
            self._resume(files)
        else:
            for name in ("adapter.bin", "steps.tsv"):
                files[name].unlink(missing_ok=True)
            if c.eval_every:
                tr.record_evaluation(0)
        while tr.step < c.steps:
            end = c.steps if not c.eval_every else min(c.steps, (tr.step // c.eval_every + 1) * c.eval_every)
            write_batches(files["batches.bin"], tr.step, [self.method.feed(tr.batch(t), t) for t in range(tr.step, end)])
            write_adapter(files["adapter.bin"], self.method.state.adapter(), tr.step)
            self._save_host_record(files)
            try:
                self.summaries.append(run_trainer(self.target, self.binary, c.program, files["batches.bin"], files["adapter.bin"],
                                                  files["steps.tsv"], c.checkpoint_every))
            except TrainingDiverged as err:
                where = "" if self.checkpoint_dir else " (a temporary folder: pass --checkpoint-dir to keep the adapter)"
                raise TrainingDiverged(f"{err}{where}") from None
            self._collect(files)
            if self.progress:
                print(f"{self.target}: {tr.step}/{c.steps} steps, loss {tr.history['losses'][-1]:.3f}", file=sys.stderr)
            if c.eval_every and tr.step % c.eval_every == 0:
                tr.record_evaluation(tr.step)
            self._save_host_record(files)
        return tr.summary()

    def _collect(self, files) -> None:
        """Take over what the C++ trainer did: the adapter (into the eager model) and the steps it logged."""
        tr = self.trainer
        step, adapter = read_adapter(files["adapter.bin"])
        self.method.state.load(adapter)
        log = read_step_log(files["steps.tsv"], self.method.q)
        for t in range(tr.step, step):
            record = step_record(log[t]["losses"], self.method.eps)
            tr.history["losses"].append(record["loss"])
            tr.history["projected_grad"].append(record["projected_grad"])
            tr.history["step_s"].append(round(log[t]["seconds"], 5))
            tr.elapsed["train_s"] += log[t]["seconds"]
        tr.step = step

    def _save_host_record(self, files) -> None:
        tr = self.trainer
        record = {"config": tr.config.identity(), "host": self.target, "evals": tr.history["evals"]}
        with atomic_file(files["host.json"]) as tmp:
            tmp.write_text(json.dumps(record, default=str))

    def _resume(self, files) -> None:
        tr = self.trainer
        if not files["adapter.bin"].is_file():
            raise FileNotFoundError(f"--resume: no adapter file of the native host at {files['adapter.bin']}")
        saved = json.loads(files["host.json"].read_text())
        current = json.loads(json.dumps(tr.config.identity(), default=str))
        if saved["config"] != current or saved["host"] != self.target:
            differ = {k: (saved["config"].get(k), v) for k, v in current.items() if saved["config"].get(k) != v}
            raise ValueError(f"the native run in {files['adapter.bin'].parent} was made with other settings (saved, "
                             f"now): {differ or {'host': (saved['host'], self.target)}}; resume with the same ones")
        self._collect(files)                                   # from step 0: every step the log holds
        tr.history["evals"] = [e for e in saved["evals"] if e["step"] <= tr.step]

    def host_record(self) -> dict:
        """The C++ trainer's own figures (the largest over its runs) and what it was built from."""
        first = self.summaries[0] if self.summaries else {}
        return {"name": self.target, "machine": "aarch64" if self.target == "native-aarch64" else platform.machine(),
                "emulated": self.target == "native-aarch64", "command": " ".join(trainer_command(self.target, Path(self.binary.name))),
                "sdk": f"executorch {executorch_version()} ({AARCH64_WHEEL if self.target == 'native-aarch64' else 'installed'} wheel)",
                "runs": len(self.summaries), "load_s": first.get("load_s"),
                "resident_after_first_step_mib": first.get("resident_after_first_step_mib"),
                "peak_resident_mib": max((s["peak_resident_mib"] for s in self.summaries), default=None)}
