"""Small builders shared by the tests and by test-only server flags (`python -m paradec.server --random-tiny`).

Nothing here downloads anything: the random tiny engine uses the project's own tokenizer (shipped with the
default model, or left by its training run) and a randomly initialised Llama, so it loads in a second.
"""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "data" / "models" / "paradec-tiny"


def tokenizer_dir() -> Path:
    for p in (DEFAULT, ROOT / "data" / "work" / "paradec-tiny" / "tokenizer"):
        if (p / "tokenizer.json").exists():
            return p
    raise RuntimeError("no paradec tokenizer found: the shipped model data/models/paradec-tiny is missing")


def device_for_tests() -> str:
    """Where the random test engines live: the CPU, or `PARADEC_TEST_DEVICE` (evals/gpu_check.py runs the
    lossless tests with it set to cuda)."""
    return os.environ.get("PARADEC_TEST_DEVICE", "cpu")


def random_engine(seed: int = 0, hidden: int = 64, layers: int = 2, init: float = 0.3):
    """A randomly initialised tiny Llama with the paradec tokenizer: fast, and varied enough outputs.

    Built the same way every time for the same arguments (initialised on the CPU, then moved to `device_for_tests()`),
    so a server process and a test process that call it with the same seed hold identical weights.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from .engine import Engine
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, intermediate_size=hidden * 2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                      initializer_range=init, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval().to(device_for_tests())
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return Engine(model, tok, name=f"random-{seed}")


def random_tiny_engine(seed: int = 0):
    """The engine of the `tiny_engine` test fixture and of `--random-tiny`."""
    return random_engine(seed)
