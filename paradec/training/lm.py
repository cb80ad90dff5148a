"""Train the embedded default model `paradec-tiny` and its draft `paradec-tiny-draft`.

`python -m paradec train default` builds the standard-library corpus (paradec.training.corpus), trains
a byte-level BPE tokenizer on it, then trains a small Llama from scratch with checkpoints every
`--ckpt-every` steps under `data/work/<name>/`, so an interrupted run resumes where it stopped. The
finished model is written as an ordinary transformers folder (config, safetensors, tokenizer, chat
template, generation config) with a model card whose figures are those of this very run.
`python -m paradec train draft` trains the ~10x smaller draft on the same corpus with the same tokenizer.
"""
from __future__ import annotations

import json
import math
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import checkpoint
from . import corpus as C

SPECIALS = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "data" / "models"
WORK = ROOT / "data" / "work"


@dataclass
class ArchSpec:
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    max_position_embeddings: int = 512


ARCHS = {
    "default": ArchSpec(320, 8, 864, 5),
    "draft": ArchSpec(128, 2, 384, 2),
    "smoke": ArchSpec(64, 2, 128, 2),   # ~1M parameters, for the test that trains a few steps
}


@dataclass
class TrainConfig:
    name: str = "paradec-tiny"
    arch: str = "default"
    steps: int = 700
    batch_size: int = 8
    seq_len: int = 512
    lr: float = 2e-3
    warmup: int = 50
    chat_fraction: float = 0.4
    vocab_size: int = 8192
    seed: int = 0
    ckpt_every: int = 50
    eval_batches: int = 20


# ---------------------------------------------------------------- tokenizer

def train_tokenizer(texts: list[str], vocab_size: int, out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", pad_token="<|pad|>",
                                   model_max_length=ARCHS["default"].max_position_embeddings)
    fast.chat_template = CHAT_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(path))


# ---------------------------------------------------------------- data

def encode_all(tok, texts: list[str]) -> torch.Tensor:
    eos = tok.eos_token_id
    ids: list[int] = []
    for t in texts:
        ids.extend(tok(t, add_special_tokens=False)["input_ids"])
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int32)


def render_chats(tok, convs: list[list[dict]]) -> list[str]:
    return [tok.apply_chat_template(c, tokenize=False) for c in convs]


def data_tensors(tok, work: Path) -> dict[str, torch.Tensor]:
    cache = work / "data.pt"
    if cache.exists():
        return torch.load(cache)
    corp = C.build_corpus()
    rng = random.Random(0)
    tr_chat = render_chats(tok, corp.train_chat)
    rng.shuffle(tr_chat)
    tr_raw = list(corp.train_raw)
    rng.shuffle(tr_raw)
    data = {
        "train_raw": encode_all(tok, tr_raw),
        "train_chat": encode_all(tok, tr_chat),
        "val_raw": encode_all(tok, corp.val_raw),
        "val_chat": encode_all(tok, render_chats(tok, corp.val_chat)),
    }
    torch.save(data, cache)
    return data


def sample_batch(data, cfg: TrainConfig, gen: torch.Generator, split: str = "train") -> torch.Tensor:
    rows = []
    for _ in range(cfg.batch_size):
        kind = "chat" if torch.rand((), generator=gen).item() < cfg.chat_fraction else "raw"
        arr = data[f"{split}_{kind}"]
        start = int(torch.randint(0, max(1, len(arr) - cfg.seq_len - 1), (), generator=gen))
        rows.append(arr[start:start + cfg.seq_len].long())
    return torch.stack(rows)


# ---------------------------------------------------------------- model

def make_model(arch: ArchSpec, tok):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=arch.hidden_size, num_hidden_layers=arch.num_hidden_layers,
        intermediate_size=arch.intermediate_size, num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_attention_heads, max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=True, rope_theta=10000.0, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, bos_token_id=None,
    )
    return LlamaForCausalLM(cfg)


@torch.no_grad()
def evaluate(model, data, cfg: TrainConfig, split_kind: str) -> float:
    """Mean token loss on fixed, non-overlapping windows of a validation array."""
    model.eval()
    arr = data[split_kind]
    n = min(cfg.eval_batches * cfg.batch_size, max(1, (len(arr) - 1) // cfg.seq_len))
    losses = []
    for i in range(0, n, cfg.batch_size):
        rows = [arr[j * cfg.seq_len:(j + 1) * cfg.seq_len].long() for j in range(i, min(n, i + cfg.batch_size))]
        x = torch.stack(rows)
        losses.append(model(input_ids=x, labels=x).loss.item())
    model.train()
    return sum(losses) / len(losses)


def train(cfg: TrainConfig, out_dir: Path | None = None, tokenizer_from: Path | None = None,
          work: Path | None = None, log=print) -> dict:
    """Train (or resume) one model; returns the run summary that the model card is written from."""
    from tqdm import tqdm

    torch.manual_seed(cfg.seed)
    out_dir = Path(out_dir or MODELS / cfg.name)
    work = Path(work or WORK / cfg.name)
    work.mkdir(parents=True, exist_ok=True)
    tok_dir = work / "tokenizer"
    if tokenizer_from is not None:
        tok = load_tokenizer(tokenizer_from)
        tok.save_pretrained(tok_dir)
    elif (tok_dir / "tokenizer.json").exists():
        tok = load_tokenizer(tok_dir)
    else:
        t0 = time.time()
        corp = C.build_corpus()
        tok = train_tokenizer(corp.train_raw + render_chats_plain(corp.train_chat), cfg.vocab_size, tok_dir)
        log(f"tokenizer: {len(tok)} tokens in {time.time() - t0:.0f}s")
    data = data_tensors(tok, work)
    log("tokens: " + ", ".join(f"{k}={len(v):,}" for k, v in data.items()))

    model = make_model(ARCHS[cfg.arch], tok)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(cfg.seed)
    state = {"step": 0, "elapsed_s": 0.0, "history": []}
    ckpt = work / "checkpoint.pt"
    saved = checkpoint.resume(ckpt, model, opt, log)
    if saved is not None:
        gen.set_state(saved["gen"])
        state = saved["state"]
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{cfg.name}: {n_params / 1e6:.2f}M parameters, {cfg.steps} steps of {cfg.batch_size}x{cfg.seq_len} tokens")

    model.train()
    bar = tqdm(total=cfg.steps, initial=state["step"], desc=f"train {cfg.name}", file=sys.stderr)
    t_last = time.time()
    while state["step"] < cfg.steps:
        step = state["step"]
        for g in opt.param_groups:
            g["lr"] = checkpoint.cosine_lr(step, cfg.lr, cfg.warmup, cfg.steps)
        x = sample_batch(data, cfg, gen)
        loss = model(input_ids=x, labels=x).loss
        checkpoint.optimizer_step(loss, model.parameters(), opt)
        state["step"] += 1
        now = time.time()
        state["elapsed_s"] += now - t_last
        t_last = now
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if state["step"] % cfg.ckpt_every == 0 or state["step"] == cfg.steps:
            state["history"].append({"step": state["step"], "loss": round(loss.item(), 4),
                                     "elapsed_s": round(state["elapsed_s"], 1)})
            checkpoint.save(ckpt, {"model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                                   "state": state, "config": asdict(cfg)})
            t_last = time.time()
    bar.close()

    val_raw = evaluate(model, data, cfg, "val_raw")
    val_chat = evaluate(model, data, cfg, "val_chat")
    summary = {
        "name": cfg.name, "parameters": n_params, "config": asdict(cfg),
        "arch": asdict(ARCHS[cfg.arch]), "vocab_size": len(tok),
        "train_tokens_seen": cfg.steps * cfg.batch_size * cfg.seq_len,
        "corpus_tokens": {k: len(v) for k, v in data.items()},
        "val_loss_raw": val_raw, "val_ppl_raw": math.exp(val_raw),
        "val_loss_chat": val_chat, "val_ppl_chat": math.exp(val_chat),
        "train_time_s": round(state["elapsed_s"], 1), "history": state["history"],
        "hardware": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
                    f"{'CUDA ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'CPU'}",
        "torch": torch.__version__, "python": platform.python_version(),
    }
    save_model(model, tok, out_dir, summary)
    log(f"saved {out_dir}: val ppl raw {summary['val_ppl_raw']:.2f}, chat {summary['val_ppl_chat']:.2f}")
    return summary


def render_chats_plain(convs):
    return ["\n".join(m["content"] for m in c) for c in convs]


def save_model(model, tok, out_dir: Path, summary: dict):
    from transformers import GenerationConfig
    out_dir.mkdir(parents=True, exist_ok=True)   # files are overwritten; adapters in subfolders (ptp/, lud/) stay
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                               bos_token_id=None, do_sample=False)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    (out_dir / "training_summary.json").write_text(json.dumps(summary, indent=1))
