"""Checkpoint files shared by every training command: written atomically, read back whole."""
from __future__ import annotations

import os
from pathlib import Path

import torch


def save(path: Path, state: dict) -> None:
    """Write `state` so that a run killed mid-write never leaves a half-written checkpoint."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load(path: Path) -> dict | None:
    """The checkpoint at `path`, or None when there is none (optimizer and RNG states included)."""
    path = Path(path)
    return torch.load(path, weights_only=False) if path.exists() else None


def resume(path: Path, module, opt, log=print) -> dict | None:
    """Load the checkpoint at `path` into `module` (key "adapter" or "model") and `opt`; returns the whole
    checkpoint (for the caller's RNG and step state) or None when there is none."""
    saved = load(path)
    if saved is not None:
        module.load_state_dict(saved["adapter"] if "adapter" in saved else saved["model"])
        opt.load_state_dict(saved["opt"])
        log(f"resumed at step {saved['state']['step']}")
    return saved


def add_run_args(p, what: str, ckpt_every: int, seed: int = 0) -> None:
    """The command-line options every adapter trainer shares (data size, checkpoints, where, on what)."""
    p.add_argument("--max-docs", type=int, default=0, help="use only this many corpus documents (0 = all)")
    p.add_argument("--ckpt-every", type=int, default=ckpt_every)
    p.add_argument("--seed", type=int, default=seed)
    p.add_argument("--out", help=f"output folder (default <model>/{what})")
    p.add_argument("--work", help="checkpoint folder (default <out>/.checkpoint, removed when training ends)")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, help="CPU threads for torch")
    p.add_argument("--no-progress", action="store_true")
