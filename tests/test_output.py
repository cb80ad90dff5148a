"""`Output`: incremental detokenisation gives exactly the text of the whole output, decodes only a short tail per
step (its cost does not grow with the output), waits inside UTF-8 sequences, and applies stop strings across step
boundaries. On the real tokenizers of the default model and paradec-tiny (no model weights needed)."""
import random
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from conftest import TINY
from paradec.strategies.base import Output, Request

TEXT = ("Here is a function:\n\n```python\ndef área(r):\n    return 3.14159 * r ** 2  # π r²\n```\n"
        "Les élèves ont mangé des crêpes. 東京は日本の首都です。 Emoji: 🎉🚀 done.\n") * 3


def _tokenizer(which):
    if which == "paradec-tiny":
        return AutoTokenizer.from_pretrained(str(TINY))
    from paradec.provision import ensure_default      # the default model's tokenizer (provisioned on first use)
    return AutoTokenizer.from_pretrained(str(ensure_default()))


class CountingEngine:
    def __init__(self, tok):
        self.tok, self.eos_ids, self.decoded = tok, {tok.eos_token_id}, []

    def decode(self, ids):
        self.decoded.append(len(ids))
        return self.tok.decode(list(ids), skip_special_tokens=True)


@pytest.mark.parametrize("which", ["paradec-tiny", "default"])
def test_incremental_text_equals_whole_decode_in_any_chunking(which):
    tok = _tokenizer(which)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    rng = random.Random(0)
    for trial in range(5):
        eng = CountingEngine(tok)
        out = Output(eng, Request(prompt="x", max_new_tokens=10_000, ignore_eos=True))
        pieces, i = [], 0
        while i < len(ids):
            n = 1 if trial == 0 else rng.randint(1, 6)
            pieces.append(out.step(ids[i:i + n]).text)
            i += n
        pieces.append(out.step([]).text)
        assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)
        assert out.text == "".join(pieces)
        # no piece ends inside a multi-byte character
        assert not any(p.endswith("\ufffd") for p in pieces)
        # each decode reads a short tail (4 tokens of context + the tokens not yet emitted: a step's, or a few
        # steps' while a character is incomplete), never the whole output
        assert max(eng.decoded) < len(ids) / 5
        assert sum(eng.decoded) / len(eng.decoded) <= 10


def test_stop_string_across_steps():
    tok = _tokenizer("default")
    ids = tok("alpha beta\n\ngamma delta", add_special_tokens=False)["input_ids"]
    out = Output(CountingEngine(tok), Request(prompt="x", stop=["\n\n"], max_new_tokens=100, ignore_eos=True))
    text = "".join(out.step([t]).text for t in ids if not out.done)
    assert text == "alpha beta" and out.finish_reason == "stop" and out.text == "alpha beta"


def test_eos_and_budget():
    tok = _tokenizer("paradec-tiny")
    eng = SimpleNamespace(decode=lambda ids: tok.decode(list(ids)), eos_ids={tok.eos_token_id})
    ids = tok("one two three four", add_special_tokens=False)["input_ids"]
    out = Output(eng, Request(prompt="x", max_new_tokens=2))
    s = out.step(ids)
    assert s.token_ids == ids[:2] and s.finished and s.finish_reason == "length"
    out = Output(eng, Request(prompt="x", max_new_tokens=50))
    s = out.step(ids[:1] + [tok.eos_token_id] + ids[1:])
    assert s.token_ids == ids[:1] and s.finish_reason == "eos"
