"""The saved state of a GRPO run, so that a killed run resumes and ends byte-identical to an uninterrupted one.

A state (`save_state`) is the folder `state_dir/step-<n>/`: the adapters, the optimizer and scheduler, the
history, the budget cuts so far (and the sha256 of each cut's folder), the wall-clock spent, and the run's
`StateKey`: its cell and fingerprint (the params, inputs, code and machine that shaped it). No generator state:
every draw of a step derives from (seed, step), the update's dropout masks included (`Trainer.learn`), so a
resumed step draws what it drew the first time. It is written atomically and replaces the older steps but the
one before it: the KL the next step logs is that of this state's policy, and when it passes
`train.health.max_kl` the run sets this state aside and the one before is the newest kept state
(`centralrl.rl.health`). `latest_state` picks the newest state when it has the caller's key and removes the
cell's states of any other run (other params, inputs, code or machine), so they are never resumed; it refuses
another cell's state and a newest state whose meta.json is damaged, naming them; `restore` loads one into a
trainer, refusing it when it cannot be read or its cuts no longer hold the bytes it recorded. A budget's cut
(`save_cut`) is a snapshot of the adapters, kept under `state_dir/cuts/<budget>/` until the run writes its
outputs.
"""

from __future__ import annotations

import json
import math
import pickle
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from peft import set_peft_model_state_dict
from safetensors import SafetensorError
from safetensors.torch import load_file

from centralrl.codedeps import folder_sha256
from centralrl.config import adapter_names
from centralrl.errors import DataError
from centralrl.io import atomic_directory, read_json, read_jsonl, write_json, write_jsonl
from centralrl.models.adapters import non_finite_weights, save_adapters
from centralrl.rl.trainer import Trainer


@dataclass
class Progress:
    """What a run carries besides the trainer: its per-step history, wall-clock spent, and the budget cuts made."""

    history: list[dict]
    wall_seconds: float = 0.0
    cuts: dict[str, dict] = field(default_factory=dict)


@dataclass(frozen=True)
class StateKey:
    """Who may resume a state: the cell (arm, seed, backbone) that saved it, under the fingerprint of the params,
    inputs, code and machine that shaped its run (`centralrl.rl.run.fingerprint`)."""

    arm: str
    seed: int
    backbone: str
    fingerprint: str

    @property
    def cell(self) -> dict:
        return {"arm": self.arm, "seed": self.seed, "backbone": self.backbone}


def save_state(trainer: Trainer, state_dir: Path, progress: Progress, key: StateKey) -> None:
    """Write step-<n>/ atomically (with the progress so far, the sha256 of every cut's folder and the key), then
    remove the steps older than the one before it (kept for the KL monitor: the module's docstring)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with atomic_directory(state_dir / f"step-{trainer.step:06d}") as tmp:
        save_adapters(trainer.policy.model, tmp / "adapters")
        torch.save(_trainer_state(trainer), tmp / "trainer.pt")
        write_jsonl(tmp / "history.jsonl", progress.history)
        write_json(
            tmp / "meta.json",
            {
                "step": trainer.step,
                "cell": key.cell,
                "fingerprint": key.fingerprint,
                "wall_seconds": progress.wall_seconds,
                "cuts": progress.cuts,
                "cut_sha256": {name: folder_sha256(state_dir / "cuts" / name) for name in sorted(progress.cuts)},
            },
        )
    for old in sorted(state_dir.glob("step-*"))[:-2]:
        shutil.rmtree(old)


def save_cut(trainer: Trainer, state_dir: Path, budget: str) -> None:
    """Keep the adapters as they are now as `budget`'s snapshot (state_dir/cuts/<budget>/)."""
    with atomic_directory(state_dir / "cuts" / budget) as tmp:
        save_adapters(trainer.policy.model, tmp)


def latest_state(state_dir: Path, key: StateKey) -> Path | None:
    """The newest state in `state_dir` when `key` saved it, or None. One this cell saved under another fingerprint,
    or an older version's (its meta.json names no cell), is stale: `state_dir` is removed, so it is never resumed.
    Another cell's state is refused naming both cells (removing it would lose that cell's training), as is a newest
    state whose meta.json is missing or no JSON object: states are written whole, so it was damaged afterwards
    (resuming the one before it would silently undo a step)."""
    saved = sorted(state_dir.glob("step-*")) if state_dir.is_dir() else []
    if not saved:
        return None
    meta = _meta(saved[-1])
    if "cell" in meta and meta["cell"] != key.cell:
        cells = [json.dumps(cell, sort_keys=True) for cell in (meta["cell"], key.cell)]
        raise DataError(
            f"{state_dir}: the training state of another cell ({cells[0]}, not {cells[1]}); give each cell its own "
            f"--state folder, or delete {state_dir} to train this cell there from step 0"
        )
    if meta.get("fingerprint") != key.fingerprint:
        print(f"{state_dir}: saved by a run with other params, inputs, code or machine; starting from step 0")
        shutil.rmtree(state_dir)
        return None
    return saved[-1]


def _meta(checkpoint: Path) -> dict:
    """A state's meta.json, which must be there and hold a JSON object."""
    path = checkpoint / "meta.json"
    if not path.is_file():
        raise _damaged(checkpoint, "no meta.json")
    try:
        meta = read_json(path)
    except DataError as error:
        raise _damaged(checkpoint, str(error).removeprefix(f"{checkpoint}/")) from None
    if not isinstance(meta, dict):
        raise _damaged(checkpoint, f"meta.json holds a JSON {type(meta).__name__}, not an object")
    return meta


# how a truncated or edited file of a state fails to load (torch.load, safetensors, a missing meta field)
UNREADABLE = (
    OSError,
    EOFError,
    ValueError,
    RuntimeError,
    KeyError,
    TypeError,
    pickle.UnpicklingError,
    SafetensorError,
)
HISTORY_KEYS = ("step", "skipped", "reward_mean", "flops.generation", "flops.update")  # what resuming reads


def restore(trainer: Trainer, checkpoint: Path) -> Progress:
    """Load adapters, optimizer, scheduler, step and generator states saved by `save_state`; return the progress.
    A state that lacks one of the trainer's adapters, that cannot be read, whose history is not one row per step
    up to its own, or whose cuts are gone or hold other bytes than it recorded, is a DataError naming it: states
    are written whole, so it was damaged afterwards, and resuming from it would train from wrong weights, publish
    damaged adapters or a short history, or fail later. Nothing is deleted: the message says what to delete to
    start the cell over."""
    expected = adapter_names(trainer.policy.adapters)
    folder = checkpoint / "adapters"
    saved = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    if saved != expected:
        raise _damaged(checkpoint, f"adapters {saved}, but the arm trains {expected}")
    meta = _meta(checkpoint)
    cuts, wall = meta.get("cuts"), meta.get("wall_seconds")
    if not isinstance(cuts, dict) or not all(isinstance(cut, dict) for cut in cuts.values()):
        raise _damaged(checkpoint, f"its meta.json's cuts are {cuts!r}, not a mapping of budgets to cuts")
    if isinstance(wall, bool) or not isinstance(wall, (int, float)) or not 0 <= wall < math.inf:
        raise _damaged(checkpoint, f"its meta.json's wall_seconds is {wall!r}, not a number of seconds")
    try:
        progress = _restored(trainer, checkpoint, meta)
    except UNREADABLE as error:
        raise _damaged(checkpoint, f"{type(error).__name__}: {' '.join(str(error).split())[:200]}") from None
    except DataError as error:  # a history line cut short or edited
        raise _damaged(checkpoint, str(error).removeprefix(f"{checkpoint}/")) from None
    for adapter in expected:
        bad = non_finite_weights(trainer.policy.model, adapter)
        if bad:
            raise _damaged(checkpoint, f"adapter {adapter}: {bad} non-finite")
    for number, row in enumerate(progress.history, start=1):
        missing = [key for key in HISTORY_KEYS if key not in row]
        if missing:
            raise _damaged(checkpoint, f"history.jsonl:{number} has no {', '.join(missing)}")
    steps = [row["step"] for row in progress.history]
    if steps != list(range(1, trainer.step + 1)):  # a lost row was resumed: its steps left out of every spending
        shown = str(steps) if len(steps) <= 6 else f"{steps[:3]} ... {steps[-3:]}"
        raise _damaged(checkpoint, f"history.jsonl holds steps {shown}, not 1 to {trainer.step} one row each")
    cuts = checkpoint.parent / "cuts"
    lost = [name for name in progress.cuts if not (cuts / name).is_dir()]
    if lost:  # its outputs would be hashed as an empty folder, then fail to copy after the whole run
        raise _damaged(checkpoint, f"it cut {', '.join(lost)}, but {cuts} has no such folder")
    recorded = meta.get("cut_sha256")
    if progress.cuts and not isinstance(recorded, dict):
        raise _damaged(checkpoint, "its meta.json records no cut_sha256 for its cuts")
    for name in sorted(progress.cuts):  # the run would publish it as the budget's adapters (budgets.json hashes it)
        if folder_sha256(cuts / name) != recorded.get(name):
            raise _damaged(checkpoint, f"{cuts / name} holds other files than the run cut there")
    return progress


def _damaged(checkpoint: Path, what: str) -> DataError:
    return DataError(
        f"{checkpoint}: a damaged training state ({what}); delete {checkpoint.parent} to train this cell from step 0"
    )


def _restored(trainer: Trainer, checkpoint: Path, meta: dict) -> Progress:
    model = trainer.policy.model
    for folder in sorted(p for p in (checkpoint / "adapters").iterdir() if p.is_dir()):
        # copied in place, so the optimizer keeps pointing at the same parameter tensors
        set_peft_model_state_dict(model, load_file(folder / "adapter_model.safetensors"), adapter_name=folder.name)
    state = torch.load(checkpoint / "trainer.pt", weights_only=False)
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.step = int(meta["step"])
    trainer.policy.weights_changed()
    return Progress([row for _, row in read_jsonl(checkpoint / "history.jsonl")], meta["wall_seconds"], meta["cuts"])


def _trainer_state(trainer: Trainer) -> dict:
    return {
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
    }
