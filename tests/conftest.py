"""Shared fixtures. Tests run offline on the CPU; none retrains the shipped models."""
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "data" / "models" / "paradec-tiny"
DRAFT = ROOT / "data" / "models" / "paradec-tiny-draft"


def tokenizer_dir() -> Path:
    for p in (DEFAULT, ROOT / "data" / "work" / "paradec-tiny" / "tokenizer"):
        if (p / "tokenizer.json").exists():
            return p
    raise RuntimeError("no paradec tokenizer found: the shipped model data/models/paradec-tiny is missing")


def random_engine(seed: int = 0, hidden: int = 64, layers: int = 2, init: float = 0.3):
    """A randomly initialised tiny Llama with the paradec tokenizer: fast, and varied enough outputs."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from paradec.engine import Engine
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, intermediate_size=hidden * 2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                      initializer_range=init, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return Engine(model, tok, name=f"random-{seed}")


@pytest.fixture(scope="session")
def tiny_engine():
    return random_engine(0)


@pytest.fixture(scope="session")
def default_engine():
    from paradec.engine import Engine
    return Engine.load(str(DEFAULT))
