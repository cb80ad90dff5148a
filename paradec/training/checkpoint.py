"""What every training command shares: checkpoint files (written atomically, read back whole), resuming,
the optimizer step, the common command-line options, and loading the model to train for."""
from __future__ import annotations

import math
import os
import sys
import time
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
    p.add_argument("--out", help=f"output folder (default: data/adapters/<model>/{what} for a model paradec ships "
                                 f"parameters for, else <model>/{what})")
    p.add_argument("--work", help="checkpoint folder (default <out>/.checkpoint, removed when training ends)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32",
                   help="the frozen base model's dtype (float32, bfloat16, or auto: bf16 where the CPU has native bf16 "
                        "matrix support); trained parameters stay float32")
    p.add_argument("--threads", type=int, help="CPU threads for torch")
    p.add_argument("--no-progress", action="store_true")


def optimizer_step(loss, params, opt, clip: float = 1.0) -> None:
    """Backward, clip the gradient norm, step, clear the gradients."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()
    opt.zero_grad(set_to_none=True)


def engine_and_out(args, adapter_cls):
    """(engine, output folder) for an adapter trainer's --model/--device/--threads/--out, or (None, why). The
    default folder is the one the adapter's kind is looked for first (`GatedAdapter.default_dir`)."""
    from ..engine import Engine, ModelError
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        engine = Engine.load(args.model, device=args.device, dtype=getattr(args, "dtype", None) or "float32")
    except ModelError as e:
        return None, str(e)
    out = Path(args.out) if args.out else adapter_cls.default_dir(engine)
    if out is None:
        return None, "the model is not a local folder; pass --out DIR for the parameters"
    return engine, out


def cosine_lr(step: int, lr: float, warmup: int, steps: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to a tenth of `lr` at `steps`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def run_steps(args, run: dict, opt, params, loss_fn, evaluate, save, desc: str) -> None:
    """The distillation trainers' loop (draft, eagle): from run["step"] to args.steps, each step at
    `cosine_lr`, loss_fn() -> (loss, {shown figures}); every args.eval_every steps run["curve"] gains
    {"step", "loss" (moving average), **evaluate()}; save() every args.ckpt_every steps and at the end; stops
    (saved) after args.max_minutes. run["elapsed"] counts training and evaluation seconds, not saving."""
    from tqdm import tqdm
    deadline = time.time() + args.max_minutes * 60 if args.max_minutes else None
    bar = tqdm(total=args.steps, initial=run["step"], desc=desc, file=sys.stderr, mininterval=10)
    ema = None
    while run["step"] < args.steps:
        ts = time.time()
        for g in opt.param_groups:
            g["lr"] = cosine_lr(run["step"], args.lr, args.warmup, args.steps)
        loss, parts = loss_fn()
        optimizer_step(loss, params, opt)
        loss = float(loss.detach())
        run["step"] += 1
        run["elapsed"] += time.time() - ts
        ema = loss if ema is None else 0.95 * ema + 0.05 * loss
        bar.update(1)
        bar.set_postfix(loss=f"{ema:.3f}", **{k: f"{v:.2f}" for k, v in parts.items()})
        step = run["step"]
        stop = deadline is not None and time.time() > deadline
        if step % args.eval_every == 0 or step == args.steps or stop:
            te = time.time()
            run["curve"].append({"step": step, "loss": round(ema, 4), **evaluate()})
            run["elapsed"] += time.time() - te
            print(run["curve"][-1], file=sys.stderr, flush=True)
        if step % args.ckpt_every == 0 or step == args.steps or stop:
            save()
        if stop:
            print(f"stopping at step {step}: --max-minutes {args.max_minutes} reached", file=sys.stderr)
            break
    bar.close()
