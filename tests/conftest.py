"""Shared fixtures. Tests run offline on the CPU; none retrains the shipped models."""
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "data" / "models" / "paradec-tiny"          # the small shipped model, --model paradec-tiny
DRAFT = ROOT / "data" / "models" / "paradec-tiny-draft"


# A test is slow (`pytest -m "not slow"` leaves it out) when it carries @pytest.mark.slow or uses one of these
# fixtures: each loads the real default model, launches the app or starts server subprocesses.
SLOW_FIXTURES = {"default_engine", "app", "servers", "drafty"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


# the builders live in paradec.testing so that `python -m paradec.server --random-tiny` builds the same engine
from paradec.testing import random_engine, random_tiny_engine, tokenizer_dir  # noqa: E402,F401


@pytest.fixture(scope="session")
def tiny_engine():
    return random_tiny_engine(0)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """The random tiny model (seed 5) saved as an ordinary model folder, for CLI and server subprocesses."""
    d = tmp_path_factory.mktemp("model")
    e = random_engine(5)
    e.model.save_pretrained(d)
    e.tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def default_engine():
    """The real default model (Qwen2.5-Coder-0.5B-Instruct), loaded as a user's first run does: no name given, so
    it is provisioned from the installed part packages on first use (once per machine; later sessions reuse it)."""
    from paradec.engine import Engine
    return Engine.load(None)


@pytest.fixture(scope="session")
def tiny_model_engine():
    """paradec-tiny, the small model trained here (selectable by name): for tests that need many model calls.
    Float32 on every machine: its tests compare batched and one-at-a-time generations token for token, which
    holds exactly in float32, while `auto` is bf16 on a CPU with AMX/AVX512-BF16, where a batch rounds
    differently from a single row and a near-tie of this small model can flip."""
    from paradec.engine import Engine
    if os.environ.get("PARADEC_TEST_DEVICE") and not (TINY / "model.safetensors").exists():
        pytest.skip("paradec-tiny's weights did not travel to this device machine (evals/gpu_check.py)")
    return Engine.load("paradec-tiny", dtype="float32")
