"""Smoke training of a ~1M-parameter model: loss falls, checkpoints resume, the result loads."""
import json

import pytest

from paradec.engine import Engine
from paradec.strategies import Request, get
from paradec.training import lm

from conftest import tokenizer_dir


@pytest.mark.slow
def test_smoke_train_resume_and_load(tmp_path):
    out, work = tmp_path / "model", tmp_path / "work"
    cfg = lm.TrainConfig(name="smoke", arch="smoke", steps=6, batch_size=4, seq_len=64, lr=5e-3, warmup=1,
                         ckpt_every=1, eval_batches=1)
    logs = []
    lm.train(cfg, out_dir=out, tokenizer_from=tokenizer_dir(), work=work, log=logs.append)
    first = json.loads((out / "training_summary.json").read_text())
    cfg.steps = 12
    lm.train(cfg, out_dir=out, tokenizer_from=tokenizer_dir(), work=work, log=logs.append)
    assert any("resumed at step 6" in line for line in logs)
    summary = json.loads((out / "training_summary.json").read_text())
    hist = summary["history"]
    assert [h["step"] for h in hist] == list(range(1, 13))
    assert sum(h["loss"] for h in hist[-3:]) / 3 < sum(h["loss"] for h in hist[:3]) / 3 - 0.2
    assert summary["val_ppl_raw"] < first["val_ppl_raw"]
    assert 0.3e6 < summary["parameters"] < 2e6
    e = Engine.load(str(out))
    r = Request(prompt="What does `os.getcwd` do?", max_new_tokens=4, ignore_eos=True)
    assert len([t for s in get("ar").stream(e, r) for t in s.token_ids]) == 4
    assert e.has_chat_template


def test_the_teacher_cache_grows_and_answers_only_new_prompts(tiny_engine, tmp_path, monkeypatch):
    """A larger prompt set whose first prompts are a smaller set's reuses the cached answers (the same rows) and
    answers only the new prompts; a cache of another length is not reused."""
    from paradec import decoding
    from paradec.training.teacher import teacher_rows
    calls = []
    real = decoding.generate

    def counting(engine, prompts, *a, **k):
        calls.append(len(prompts))
        return real(engine, prompts, *a, **k)
    monkeypatch.setattr(decoding, "generate", counting)
    prompts = [[5 + i, 9 + 2 * i, 40 + i] for i in range(5)]
    f = tmp_path / "teacher.pt"
    first = teacher_rows(tiny_engine, prompts[:3], 6, 0, f, "train")
    assert calls == [3, 3] and len(first) == 6 and sum(r["greedy"] for r in first) == 3
    more = teacher_rows(tiny_engine, prompts, 6, 0, f, "train")
    assert calls == [3, 3, 2, 2] and len(more) == 10
    old = {(tuple(r["prompt"]), r["greedy"]): r["completion"] for r in first}
    assert all(old[(tuple(r["prompt"]), r["greedy"])] == r["completion"] for r in more if tuple(r["prompt"]) in
               {tuple(p) for p in prompts[:3]})
    assert [r["greedy"] for r in more] == [False] * 5 + [True] * 5        # sampled rows first, then greedy
    again = teacher_rows(tiny_engine, prompts, 6, 0, f, "train")
    assert calls == [3, 3, 2, 2] and again == more                         # all cached now
    teacher_rows(tiny_engine, prompts[:2], 7, 0, f, "train")              # another length: answered anew
    assert calls[-2:] == [2, 2]


def test_the_teacher_cache_answers_greedy_only_prompts_and_reads_older_caches(tiny_engine, tmp_path, monkeypatch):
    """`sampled=False` makes only the greedy answers, and only for prompts that lack one; a later sampled call
    makes just the missing sampled answers; a cache written before per-kind records counts both kinds as made;
    a stop between chunks keeps the chunks already made."""
    import torch
    from paradec import decoding
    from paradec.training.teacher import teacher_rows
    calls = []
    real = decoding.generate

    def counting(engine, prompts, max_new, sp, *a, **k):
        calls.append((len(prompts), sp.temperature == 0))
        return real(engine, prompts, max_new, sp, *a, **k)
    monkeypatch.setattr(decoding, "generate", counting)
    prompts = [[5 + i, 9 + 2 * i, 40 + i] for i in range(5)]
    f = tmp_path / "teacher.pt"
    g = teacher_rows(tiny_engine, prompts[:4], 6, 0, f, "train", sampled=False, chunk=3)
    assert calls == [(3, True), (1, True)] and len(g) == 4 and all(r["greedy"] for r in g)
    both = teacher_rows(tiny_engine, prompts, 6, 0, f, "train")
    assert calls[2:] == [(5, False), (1, True)] and len(both) == 10
    assert [r["completion"] for r in both if r["greedy"]][:4] == [r["completion"] for r in g]
    saved = torch.load(f)
    del saved["done"]                                       # the format before per-kind records
    del saved["key"]["dtype"]                               # and before the dtype entry: float32 answers
    torch.save(saved, f)
    assert teacher_rows(tiny_engine, prompts, 6, 0, f, "train") == both and len(calls) == 4
    calls.clear()

    def stopping(engine, prompts, max_new, sp, *a, **k):
        if calls:
            raise KeyboardInterrupt
        calls.append(len(prompts))
        return real(engine, prompts, max_new, sp, *a, **k)
    monkeypatch.setattr(decoding, "generate", stopping)
    f2 = tmp_path / "t2.pt"
    with pytest.raises(KeyboardInterrupt):
        teacher_rows(tiny_engine, prompts, 6, 0, f2, "train", sampled=False, chunk=2)
    monkeypatch.setattr(decoding, "generate", counting)
    calls.clear()
    again = teacher_rows(tiny_engine, prompts, 6, 0, f2, "train", sampled=False, chunk=2)
    assert calls == [(2, True), (1, True)] and len(again) == 5     # the first chunk was kept
