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
