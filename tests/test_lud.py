"""Lexical Unit Decoding: gate exactness, the lexical-unit label rule, training, save/load, the `lud`
strategy (threshold 1.0 == ar token for token) and the `train lud` command on a random tiny Llama folder."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from paradec.adapters import base_signature, fingerprint
from paradec.lud import (AdapterError, LUDAdapter, LUDConfig, adapter_for, load_adapter,
                         pad_group_mask)
from paradec.race import run_alone
from paradec.strategies import Request, RequestError, get
from paradec.strategies.prompt_lookup import ContextIndex, CopyRate
from paradec.testing import random_engine
from paradec.training import lud_train as T

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["def parse(text):\n", "What does `json.dumps` do?", "Outline the module `os.path`.",
           "import os\nimport sys\n\nclass Reader:\n"]


def _perturbed_adapter(engine, seed=1, k=4, std=0.05):
    torch.manual_seed(seed)
    ad = LUDAdapter(engine.model, LUDConfig(k=k, base=base_signature(engine.model)))
    with torch.no_grad():
        for p in ad.lora_b.values():
            p.normal_(0, std)
        ad.pad_embedding.normal_(0, 1.0)
    return ad.eval().requires_grad_(False)


def _tokens(engine, strategy, prompt, params=None, **kw):
    lane = run_alone(engine, strategy, Request(prompt=prompt, max_new_tokens=kw.pop("max_new_tokens", 24), **kw),
                     params or {})
    assert lane.error is None, lane.error
    return lane


@pytest.fixture(scope="module")
def eng():
    e = random_engine(3)
    torch.set_num_threads(1)
    return e


@pytest.fixture(scope="module")
def trained(eng, tmp_path_factory):
    """A few real training steps on the tiny random model; returns (summary, out folder)."""
    out = tmp_path_factory.mktemp("lud") / "lud"
    cfg = T.LUDTrainConfig(steps=24, batch=2, window=64, cuts=16, greedy=4, greedy_tokens=16, max_docs=3,
                           ckpt_every=6, lr=1e-2, warmup=2, alpha=0.1)
    summary = T.train_lud(eng, cfg, out, log=lambda m: None, progress=False)
    eng.extras.pop("lud", None)
    return summary, out


# ------------------------------------------------------------------ model side

def test_gate_keeps_real_logits_identical(eng):
    ad = _perturbed_adapter(eng)
    ids = eng.tokenizer("def f(x):\n    return x", add_special_tokens=False)["input_ids"]
    base = eng.forward(ids)[0]
    tokens = ids + [eng.pad_id] * 3
    gate = torch.zeros(len(tokens), dtype=torch.bool)
    gate[len(ids):] = True
    with ad.applied(eng.model, gate):
        mixed = eng.forward(tokens)[0]
    plain = eng.forward(tokens)[0]        # hooks removed on exit: plain base model again
    V = base.shape[-1]
    assert mixed.shape[-1] == V + 1                       # + the adapter's STOP class
    assert torch.equal(mixed[:len(ids), :V], base)        # real positions: the base logits, bit for bit
    assert torch.isinf(mixed[:len(ids), V]).all() and torch.isfinite(mixed[len(ids):, V]).all()
    assert not torch.allclose(mixed[len(ids):, :V], plain[len(ids):])   # the adapter does act on pad slots
    assert torch.equal(plain[:len(ids)], base)
    assert not eng.model.get_input_embeddings()._forward_hooks


def test_pad_group_mask_layout():
    m = pad_group_mask(5, [2, 4], 2)
    assert m.shape == (4, 9)
    assert m[0, :2].all() and not m[0, 2:5].any() and m[0, 5] and not m[0, 6]
    assert m[1, 5:7].all() and not m[1, 7:].any()
    assert m[2, :4].all() and not m[2, 4] and m[2, 7] and not m[2, 8] and not m[2, 5:7].any()


def test_unit_label_rule():
    tokens = torch.tensor([10, 11, 12, 13, 14, 15, 16])
    conf = torch.tensor([0.0, 0.95, 0.95, 0.2, 0.99, 0.99, 0.99])
    lab = T.unit_labels(tokens, conf, [1, 3, 4], 3, alpha=0.9, stop_id=0).view(3, 3).tolist()
    # cut 1: x1,x2 confident -> slot1 = x2; x3 not -> slot2 = STOP; slot3 ignored
    assert lab[0] == [12, 0, T.IGNORE]
    # cut 3: x3 itself not confident -> the unit is empty: STOP at once
    assert lab[1] == [0, T.IGNORE, T.IGNORE]
    # cut 4: x4, x5, x6 confident; slot 3 would be x7, past the window -> ignored
    assert lab[2] == [15, 16, T.IGNORE]


def test_training_loss_falls_and_parameters_load(eng, trained):
    summary, out = trained
    hist = summary["history"]
    assert len(hist) == 4 and hist[-1]["step"] == 24
    assert hist[-1]["loss"] < hist[0]["loss"] * 0.8, hist
    assert (out / "adapter.safetensors").exists() and (out / "README.md").exists()
    assert not (out / ".checkpoint").exists()
    cfg = json.loads((out / "lud_config.json").read_text())
    assert cfg["k"] == 4 and cfg["base"]["hidden_size"] == 64
    ad = load_adapter(out, eng.model)
    assert torch.count_nonzero(next(iter(ad.lora_b.values()))) > 0
    # loaded parameters reproduce the saved ones: same pad-slot logits through either adapter object
    again = load_adapter(out, eng.model)
    ids = [5, 6, 7, 8, eng.pad_id, eng.pad_id]
    gate = torch.tensor([0, 0, 0, 0, 1, 1], dtype=torch.bool)
    with ad.applied(eng.model, gate):
        a = eng.forward(ids)
    with again.applied(eng.model, gate):
        b = eng.forward(ids)
    assert torch.equal(a, b)


def test_load_refuses_another_model(trained):
    _, out = trained
    other = random_engine(0, hidden=32)
    with pytest.raises(AdapterError, match="hidden_size"):
        load_adapter(out, other.model)


def test_trained_parameters_record_the_base_model(eng, trained):
    """The trainer saves through the shared adapter files (paradec/adapters.py): the format tag and the base
    model's fingerprint, so parameters for other weights of the same shape are refused."""
    cfg = json.loads((trained[1] / "lud_config.json").read_text())
    assert cfg["format"] == "paradec-lud" and cfg["base_fingerprint"] == fingerprint(eng.model)
    with pytest.raises(AdapterError, match="other weights"):
        load_adapter(trained[1], random_engine(4).model)


def test_resume_from_checkpoint(eng, tmp_path):
    cfg = T.LUDTrainConfig(steps=2, batch=1, window=48, cuts=8, greedy=0, max_docs=2, ckpt_every=1, warmup=1)
    work = tmp_path / "work"
    T.train_lud(eng, cfg, tmp_path / "out", work_dir=work, log=lambda m: None, progress=False)
    assert (work / "lud_checkpoint.pt").exists()          # an explicit work folder is kept
    logs = []
    cfg.steps = 3
    s = T.train_lud(eng, cfg, tmp_path / "out", work_dir=work, log=logs.append, progress=False)
    eng.extras.pop("lud", None)
    assert any("resumed at step 2" in m for m in logs)
    assert s["steps_done"] == 3 and [h["step"] for h in s["history"]] == [1, 2, 3]


def test_init_continues_from_earlier_parameters_and_the_card_says_so(eng, tmp_path):
    """--init starts a run from parameters already trained (same k, rank, targets): the first step's parameters
    are theirs, the card names where they came from, and a different structure is refused."""
    from paradec.lud import LUDAdapter
    cfg = T.LUDTrainConfig(steps=2, batch=1, window=48, cuts=8, greedy=0, max_docs=2, ckpt_every=1, warmup=1)
    T.train_lud(eng, cfg, tmp_path / "a", log=lambda m: None, progress=False)
    eng.extras.pop("lud", None)
    first = LUDAdapter.load(tmp_path / "a", eng.model)
    cfg2 = T.LUDTrainConfig(steps=1, batch=1, window=48, cuts=8, greedy=0, max_docs=2, ckpt_every=1, warmup=1,
                            lr=0.0, init=str(tmp_path / "a"))                  # lr 0: the step changes nothing
    s = T.train_lud(eng, cfg2, tmp_path / "b", log=lambda m: None, progress=False)
    eng.extras.pop("lud", None)
    again = LUDAdapter.load(tmp_path / "b", eng.model)
    for k, v in first.state_dict().items():
        assert torch.equal(v, again.state_dict()[k]), k
    assert s["init"]["steps"] == 2 and s["init"]["folder"] == str(tmp_path / "a")
    assert "started from the parameters then in" in (tmp_path / "b" / "README.md").read_text()
    with pytest.raises(SystemExit, match="same --k, --rank"):
        T.train_lud(eng, T.LUDTrainConfig(steps=1, batch=1, window=48, cuts=8, greedy=0, max_docs=2, rank=2,
                                          init=str(tmp_path / "a")), tmp_path / "c", log=lambda m: None,
                    progress=False)
    eng.extras.pop("lud", None)


def test_teacher_data_with_greedy_only_prompts_from_a_given_cache(eng, tmp_path):
    """--data teacher --sampled-prompts K --teacher-cache F: the first K training prompts are answered twice
    (sampled and greedy), the others once (greedy), the answers are cached in F and a second run reads them."""
    cfg = T.LUDTrainConfig(steps=1, batch=1, window=48, cuts=8, ckpt_every=1, warmup=1, data="teacher", prompts=5,
                           sampled_prompts=2, teacher_cache=str(tmp_path / "answers"))
    s = T.train_lud(eng, cfg, tmp_path / "out", log=lambda m: None, progress=False)
    eng.extras.pop("lud", None)
    assert s["teacher_rows"] == 2 * 2 + 3
    card = (tmp_path / "out" / "README.md").read_text()
    assert "the first 2 with one sampled" in card and "7 answers" in card
    assert "lud-verified tokens/pass chain / branch" in card and "| 0.3 |" in card    # the lossless figures too
    cached = tmp_path / "answers" / "teacher.pt"
    assert cached.exists()
    stamp = cached.stat().st_mtime_ns
    logs = []
    T.train_lud(eng, cfg, tmp_path / "out2", log=logs.append, progress=False)
    eng.extras.pop("lud", None)
    assert cached.stat().st_mtime_ns == stamp                 # read, not answered again
    assert any("the first 2 with one sampled" in m and "the other 3 the greedy one only" in m for m in logs)


# ------------------------------------------------------------------ strategy

def test_unavailable_without_parameters(eng):
    s = get("lud")
    assert s.lossless is False
    ok, why = s.available(eng)
    assert not ok and "python -m paradec train lud --model" in why
    with pytest.raises(RequestError, match="train lud"):
        list(s.stream(eng, Request(prompt="x", max_new_tokens=2)))


@pytest.mark.parametrize("which", ["untrained", "perturbed", "trained"])
def test_threshold_one_equals_ar(eng, trained, which):
    if which == "untrained":
        eng.extras["lud"] = LUDAdapter(eng.model, LUDConfig(base=base_signature(eng.model))).eval()
    elif which == "perturbed":
        eng.extras["lud"] = _perturbed_adapter(eng)
    else:
        eng.extras["lud"] = load_adapter(trained[1], eng.model)
    try:
        assert get("lud").available(eng)[0]
        for p in PROMPTS:
            ar = _tokens(eng, "ar", p)
            lud = _tokens(eng, "lud", p, {"threshold": 1.0, "k": 4})
            assert lud.token_ids == ar.token_ids, p
            assert lud.text == ar.text
            f = lud.figures()
            assert f.forward_passes == len(lud.token_ids) and f.accepted == 0 and f.drafted > 0
        # sampling: the first token of each step uses the request's u stream, like ar
        ar = _tokens(eng, "ar", PROMPTS[0], temperature=0.9, seed=7)
        lud = _tokens(eng, "lud", PROMPTS[0], {"threshold": 1.0}, temperature=0.9, seed=7)
        assert lud.token_ids == ar.token_ids
    finally:
        eng.extras.pop("lud", None)


def test_low_threshold_accepts_pad_predictions(eng):
    eng.extras["lud"] = _perturbed_adapter(eng, std=0.02)
    try:
        lane = _tokens(eng, "lud", PROMPTS[1], {"threshold": 0.0, "k": 4, "max_repeat": 0}, max_new_tokens=30,
                       ignore_eos=True)
        f = lane.figures()
        assert len(lane.token_ids) == 30
        assert f.accepted > 0 and f.forward_passes < 30
        assert f.forward_passes + f.accepted == 30      # every pass: one base token + the accepted pad tokens
        for s in lane.steps:
            assert s.forward_passes == 1 and s.accepted <= s.drafted <= 3
        # the repetition rule: with max_repeat 1 no pad token repeats the token before it
        ad = eng.extras["lud"]
        with torch.no_grad():
            ad.stop_bias.fill_(-1e4)        # never STOP
        lane2 = _tokens(eng, "lud", PROMPTS[1], {"threshold": 0.0, "max_repeat": 1}, max_new_tokens=30,
                        ignore_eos=True)
        assert len(lane2.token_ids) == 30 and lane2.figures().accepted > 0
        for g in lane2.groups:
            assert all(g["ids"][j] != g["ids"][j - 1] for j in range(1, len(g["ids"])))
    finally:
        eng.extras.pop("lud", None)


def test_adapter_parameter_and_default_folder(eng, trained, tmp_path):
    _, out = trained
    lane = _tokens(eng, "lud", PROMPTS[0], {"adapter": str(out), "threshold": 1.0})
    assert lane.token_ids == _tokens(eng, "ar", PROMPTS[0]).token_ids
    # a model folder with <model>/lud/ is found without any parameter
    folder = tmp_path / "model"
    eng.model.save_pretrained(folder)
    eng.tokenizer.save_pretrained(folder)
    import shutil
    shutil.copytree(out, folder / "lud")
    from paradec.engine import Engine
    e2 = Engine.load(str(folder), device="cpu")
    assert get("lud").available(e2)[0]
    assert adapter_for(e2) is adapter_for(e2)


def test_auto_k_is_two_on_a_float32_cpu_else_the_parameters_k(eng):
    eng.extras["lud"] = _perturbed_adapter(eng, std=0.02, k=5)
    try:
        lane = _tokens(eng, "lud", PROMPTS[1], {"threshold": 0.0, "max_repeat": 0}, max_new_tokens=12, ignore_eos=True)
        one_slot = eng.device.type == "cpu" and eng.dtype == torch.float32      # auto k = 2 there: one pad slot
        assert lane.figures().accepted > 0 and all(s.drafted <= (1 if one_slot else 4) for s in lane.steps)
        assert max(s.drafted for s in lane.steps) == (1 if one_slot else 4)
        wide = _tokens(eng, "lud", PROMPTS[1], {"threshold": 0.0, "max_repeat": 0, "k": 5}, max_new_tokens=12,
                       ignore_eos=True)
        assert max(s.drafted for s in wide.steps) == 4
    finally:
        eng.extras.pop("lud", None)


def test_heldout_replay_is_the_step_lud_takes(eng):
    """The trainer's held-out figures replay lud's step at an answer position: at the answer's first position
    the replayed step accepts exactly the pad tokens `lud` accepts on its first pass, and calls them wrong
    exactly when they differ from ar's tokens."""
    ad = _perturbed_adapter(eng, std=0.02)
    eng.extras["lud"] = ad
    try:
        seen_accept = seen_wrong = False
        for p in PROMPTS:
            for th in (0.0, 0.05):
                ar = _tokens(eng, "ar", p, max_new_tokens=4, ignore_eos=True)
                lud = _tokens(eng, "lud", p, {"threshold": th, "k": 4, "max_repeat": 0}, max_new_tokens=4,
                              ignore_eos=True)
                prompt = eng.encode(Request(prompt=p))
                row = {"prompt": prompt, "completion": ar.token_ids, "kind": "t"}
                x, greedy, cuts, conf, top = T.pad_predictions(eng, ad, row)
                assert cuts[0] == len(prompt) and greedy[len(prompt)] == ar.token_ids[0]
                n, wrong = T.replay_step(x, greedy, cuts[0], conf[0], top[0], 4, th, ad.config.stop_id)
                first = lud.groups[0]["ids"]
                assert n == len(first) - 1
                assert wrong == (first[1:] != ar.token_ids[1:len(first)])
                seen_accept |= n > 0
                seen_wrong |= wrong
                figs = T.heldout_figures(eng, ad, [row], 4, (th,))
                assert {f["kind"] for f in figs} == {"all", "t"} and all(f["cuts"] == 3 for f in figs)
        assert seen_accept and seen_wrong          # the cases compared include accepted and wrong tokens
        # threshold 1.0 accepts nothing: one token per pass, never wrong
        figs = T.heldout_figures(eng, ad, [row], 4, (1.0,))
        assert all(f["tokens_per_pass"] == 1.0 and f["wrong_steps"] == 0.0 for f in figs)
    finally:
        eng.extras.pop("lud", None)


# ------------------------------------------------------------------ command

@pytest.mark.slow
def test_train_command_on_random_tiny_folder(tmp_path):
    e = random_engine(5, hidden=32)
    folder = tmp_path / "tiny"
    e.model.save_pretrained(folder)
    e.tokenizer.save_pretrained(folder)
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "paradec.training.lud_train", "--model", str(folder), "--steps", "3",
                        "--batch", "1", "--window", "48", "--cuts", "8", "--data", "corpus", "--greedy", "2", "--max-docs", "2",
                        "--threads", "1", "--no-progress"], capture_output=True, text=True, timeout=120, env=env,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["steps"] == 3 and Path(res["out"]) == folder / "lud"
    assert (folder / "lud" / "adapter.safetensors").exists()
    assert "python -m paradec train lud" in (folder / "lud" / "README.md").read_text()
    # bad arguments are refused with a message, not a traceback
    assert T.train_lud_main(["--model", str(folder), "--k", "1"]) == 2
    assert T.train_lud_main(["--model", str(tmp_path / "missing")]) == 2


# ------------------------------------------------------------------ lud-verified (lossless)

@pytest.fixture(scope="module")
def looping_with_pads():
    """A random model with small weights, which soon repeats its tokens, and LUD parameters whose pad slots read
    like its most repeated token: their guesses are often right and often wrong."""
    e = random_engine(0, init=0.1)
    ar = _tokens(e, "ar", PROMPTS[0], max_new_tokens=30, ignore_eos=True)
    t = max(set(ar.token_ids), key=ar.token_ids.count)
    ad = LUDAdapter(e.model, LUDConfig(k=4, base=base_signature(e.model))).eval().requires_grad_(False)
    with torch.no_grad():
        ad.pad_embedding.copy_(e.model.model.embed_tokens.weight[t])
        ad.stop_bias.fill_(-1e4)
    e.extras["lud"] = ad
    return e


@pytest.mark.parametrize("layout", ["chain", "branch"])
def test_verified_lud_is_ar_token_for_token_where_lud_is_not(looping_with_pads, layout):
    eng = looping_with_pads
    changed = accepted = refused = after_refusal = 0
    for p in PROMPTS:
        ar = _tokens(eng, "ar", p, max_new_tokens=30, ignore_eos=True)
        lud = _tokens(eng, "lud", p, {"threshold": 0.0, "k": 4, "max_repeat": 0}, max_new_tokens=30, ignore_eos=True)
        v = _tokens(eng, "lud-verified", p, {"threshold": 0.0, "k": 4, "layout": layout, "lookup": 0},
                    max_new_tokens=30, ignore_eos=True)
        assert v.token_ids == ar.token_ids, p
        changed += lud.token_ids != ar.token_ids
        f = v.figures()
        assert f.forward_passes + f.accepted == 30          # every pass: its accepted drafts + the base's token
        for s in v.steps:
            assert s.forward_passes == 1 and 0 <= s.accepted <= s.drafted <= 3
        accepted += f.accepted
        refused += f.drafted - f.accepted
        # a pass after a refused draft: drafts only in the branch layout (its pads read after the accepted prefix)
        after_refusal += sum(b.drafted for a, b in zip(v.steps, v.steps[1:]) if a.accepted < a.drafted)
    assert changed and accepted > 10 and refused > 10   # lud's unverified guesses changed the text; these did not
    assert (after_refusal > 10) if layout == "branch" else (after_refusal == 0)
    # threshold 1.0 drafts nothing: ar with pad slots (lookup 0: no copies either)
    v = _tokens(eng, "lud-verified", PROMPTS[0], {"threshold": 1.0, "k": 4, "layout": layout, "lookup": 0},
                max_new_tokens=12, ignore_eos=True)
    assert v.figures().drafted == 0 and v.figures().forward_passes == 12


def test_verified_lud_with_copied_drafts_is_ar_token_for_token(looping_with_pads):
    """`lookup`: tokens copied from the context follow the pad drafts in the pass; the random model repeats itself,
    so copies are drafted, often accepted and sometimes refused - and the output is still ar's, greedy and sampled,
    within the budget."""
    from paradec.strategies.lexical_units_verified import COST_WIDTHS
    eng = looping_with_pads
    saved = eng.extras.pop("pass_costs", None)
    key = f"lud-{id(eng.extras['lud'])}"                     # flat costs: the cut keeps whole copies, with pads
    eng.extras["pass_costs"] = {f"{key}-shut": {w: 0.05 for w in COST_WIDTHS},
                                f"{key}-k4": {w: 0.05 for w in COST_WIDTHS}}

    def steps(p, params, **kw):
        req = Request(prompt=p, params=params, **{"max_new_tokens": 30, "ignore_eos": True, **kw})
        return list(get("lud-verified").stream(eng, req))
    try:
        copied = accepted_copies = 0
        for p, kw in zip(PROMPTS, ({}, {}, {"temperature": 0.2, "seed": 5}, {"temperature": 0.2, "seed": 9})):
            ar = _tokens(eng, "ar", p, max_new_tokens=30, ignore_eos=True, **kw)
            st = steps(p, {"threshold": 0.5, "k": 4, "lookup": 8}, **kw)
            assert [t for s in st for t in s.token_ids] == ar.token_ids, p
            for s in st:
                c = s.info["copied"]
                assert 0 <= c <= 8 and c <= s.drafted and 0 <= s.accepted <= s.drafted
                copied += c
                accepted_copies += max(0, s.accepted - (s.drafted - c))
        assert copied > 10 and 0 < accepted_copies < copied
        eng.extras["pass_costs"][f"{key}-k4"] = {w: 1.0 for w in COST_WIDTHS}   # a gated pass costs 20 shut ones:
        for p in PROMPTS[:2]:                                                 # pld's passes after the first
            st = steps(p, {"threshold": 0.5, "k": 4, "lookup": 8})
            assert [t for s in st for t in s.token_ids] == _tokens(eng, "ar", p, max_new_tokens=30,
                                                                   ignore_eos=True).token_ids
            assert st[0].info["pads"] and not any(s.info["pads"] for s in st[1:])
            assert sum(s.info["copied"] for s in st) > 5
        assert "copied" not in steps(PROMPTS[0], {"threshold": 0.5, "k": 4, "lookup": 0})[-1].info   # pads only
        for n in (1, 2, 5):
            st = steps(PROMPTS[0], {"threshold": 0.0, "k": 4, "lookup": 8}, max_new_tokens=n)
            assert sum(len(s.token_ids) for s in st) == n
        assert "copied" not in steps(PROMPTS[0], {"k": 4, "lookup": 8, "layout": "branch"})[-1].info  # chain only
    finally:
        eng.extras.pop("pass_costs", None)
        if saved is not None:
            eng.extras["pass_costs"] = saved


def test_preload_measures_the_pass_costs_lookup_reads(looping_with_pads):
    """The server measures lud-verified's pass costs at start (`preload`), so no request pays them; the adapter is
    not left attached."""
    from paradec import adapters
    from paradec.strategies.lexical_units import auto_k
    from paradec.strategies.lexical_units_verified import COST_WIDTHS, preload
    eng = looping_with_pads
    saved = eng.extras.pop("pass_costs", None)
    try:
        preload(eng)
        ad = eng.extras["lud"]
        key = f"lud-{id(ad)}"
        for k in (f"{key}-shut", f"{key}-k{auto_k(eng, ad, 0)}"):      # the k a default request runs
            assert sorted(eng.extras["pass_costs"][k]) == sorted(COST_WIDTHS)
            assert all(v > 0 for v in eng.extras["pass_costs"][k].values())
        assert id(eng.model) not in adapters._ON
        preload(random_engine(1))                                  # no LUD parameters: nothing to measure
    finally:
        eng.extras.pop("pass_costs", None)
        if saved is not None:
            eng.extras["pass_costs"] = saved


def test_copies_are_cut_where_a_row_stops_paying():
    """Copier.propose keeps the copy's prefix, with or without pad slots, that maximises expected tokens per second
    of the pass: all of it when rows are free, none when each row costs a whole pass, fewer as its acceptance rate
    falls; pad slots when they pay for what they bring the next step, none when the gate costs more."""
    from paradec.strategies.lexical_units_verified import Copier
    c = Copier.__new__(Copier)
    c.most, c.k, c.index, c.rates = 8, 4, ContextIndex(3), CopyRate()
    c.pad_hits, c.pad_steps, c.after_pads = 1.0, 2.0, False
    c.index.extend([1, 2, 3, 4, 5, 6, 7, 8, 1, 2])          # ... 1 2 -> copy 3 4 5 6 7 8 1 2
    c.costs = c.gated = {1: 1.0, 32: 1.0}                    # flat: every copied token pays, and the pad slots
    assert c.propose([], [], 64) == ([3, 4, 5, 6, 7, 8, 1, 2], 2, True)
    assert c.propose([3], [0.9], 64) == ([4, 5, 6, 7, 8, 1, 2, 3], 3, True)  # after a pad draft: seq + [3]
    assert c.propose([], [], 4) == ([3, 4, 5], 2, False)    # 4 left: at most 3 drafts, no room for pad slots
    c.gated = {1: 2.0, 32: 2.0}                              # the gated pass costs two: the copy without pads
    assert c.propose([], [], 64) == ([3, 4, 5, 6, 7, 8, 1, 2], 2, False)
    c.index = ContextIndex(3)
    c.index.extend([1, 2, 3])                                # nothing to copy
    assert c.propose([], [], 64) == ([], 0, False)           # 1 token / 1.0 beats (1 + 0.5) / 2.0
    c.gated = {1: 1.1, 32: 1.1}
    assert c.propose([], [], 64) == ([], 0, True)            # (1 + 0.5) / 1.1 beats 1 / 1.0
    c.index.extend([1, 2])
    c.k, c.costs = 1, {1: 1.0, 2: 2.0}                       # no pad slots, every row a whole pass: nothing pays
    assert c.propose([], [], 64) == ([], 2, False)
    c.k, c.costs = 4, {1: 1.0, 32: 1.0 + 31 * 0.05}          # 5% a row
    c.gated = {w: v + 0.2 for w, v in c.costs.items()}
    many = len(c.propose([], [], 64)[0])
    assert many >= 2
    for _ in range(6):
        c.rates.record(2, 4, 0)                              # copies after 2-grams keep failing
    assert len(c.propose([], [], 64)[0]) < many
    c.settled([3], pads=1, copied=3, ngram=1, accepted=2, had_pads=True)   # the pad draft and the first copy
    assert c.rates.tries[1] == pytest.approx(0.8 * 2 + 2) and c.rates.hits[1] == pytest.approx(0.8 + 1)  # held
    assert not c.after_pads                                  # a refused draft: the pads' guesses are dropped
    c.settled([4], pads=2, copied=3, ngram=1, accepted=1, had_pads=True)   # a pad draft refused: no copy tried
    assert c.rates.tries[1] == pytest.approx(0.8 * 2 + 2) and c.pad_steps == 2.0
    c.settled([5], pads=0, copied=0, ngram=0, accepted=0, had_pads=True)
    assert c.after_pads
    c.settled([6, 7], pads=2, copied=0, ngram=0, accepted=1, had_pads=False)  # 1 of the 2 pad drafts held
    assert (c.pad_hits, c.pad_steps) == (pytest.approx(0.8 + 1), pytest.approx(0.8 * 2 + 1)) and not c.after_pads


def test_verified_lud_in_bf16_through_the_native_lora_kernel_is_ar_token_for_token(looping_with_pads):
    """A bf16 model on a CPU with packed linears: the pad rows' LoRA deltas go through paradec's native kernel
    (`native.lora_add`; tests/test_adapters.py checks its deltas against the training path), the real rows stay the
    base model's, so lud-verified is still ar token for token, greedy and sampled."""
    from paradec import kernels, native
    from paradec.engine import Engine
    if not (native.available() and kernels.packing_available()):
        pytest.skip("needs the native kernel and oneDNN's packed bf16 linears")
    src = looping_with_pads
    model = random_engine(0, init=0.1).model.to(torch.bfloat16)
    kernels.apply(model, torch.device("cpu"), torch.bfloat16)
    e = Engine(model, src.tokenizer, name="random-0-bf16")
    ad = src.extras["lud"]
    e.extras["lud"] = LUDAdapter.from_files(ad.file_config(), ad.tensors(), e.model)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():                      # deltas that move the pad rows (the fixture's B are zero)
        for b in e.extras["lud"].lora_b.values():
            b.copy_(torch.randn(b.shape, generator=g) * 0.02)
    accepted = 0
    for p, kw in zip(PROMPTS, ({}, {}, {"temperature": 0.3, "seed": 5}, {"temperature": 0.3, "seed": 9})):
        ar = _tokens(e, "ar", p, max_new_tokens=24, ignore_eos=True, **kw)
        v = _tokens(e, "lud-verified", p, {"threshold": 0.0, "k": 4, "lookup": 0}, max_new_tokens=24, ignore_eos=True,
                    **kw)
        assert v.token_ids == ar.token_ids, p
        accepted += v.figures().accepted
    assert e.extras["lud"]._natives and accepted > 5


@pytest.mark.parametrize("layout", ["chain", "branch"])
def test_verified_lud_sampled_is_ar_with_the_same_seed_and_keeps_the_budget(looping_with_pads, layout):
    eng = looping_with_pads
    accepted = 0
    for seed in (1, 7, 11):
        ar = _tokens(eng, "ar", PROMPTS[3], temperature=0.2, seed=seed, max_new_tokens=20, ignore_eos=True)
        v = _tokens(eng, "lud-verified", PROMPTS[3], {"threshold": 0.0, "k": 4, "layout": layout}, temperature=0.2,
                    seed=seed, max_new_tokens=20, ignore_eos=True)
        assert v.token_ids == ar.token_ids
        accepted += v.figures().accepted
    assert accepted > 0
    for n in range(1, 7):
        v = _tokens(eng, "lud-verified", PROMPTS[0], {"threshold": 0.0, "k": 4, "layout": layout}, max_new_tokens=n,
                    ignore_eos=True)
        assert len(v.token_ids) == n


def test_verified_replay_counts_what_the_strategy_does(looping_with_pads):
    """The trainer's held-out replay of `lud-verified` over a greedy answer gives the strategy's own token and
    pass counts for an answer as long as the budget."""
    eng = looping_with_pads
    ad = eng.extras["lud"]
    for p in PROMPTS:
        ar = _tokens(eng, "ar", p, max_new_tokens=24, ignore_eos=True)
        row = {"prompt": eng.encode(Request(prompt=p)), "completion": ar.token_ids}
        x, greedy, cuts, conf, top = T.pad_predictions(eng, ad, row)
        for th in (0.0, 0.5):
            for layout in ("chain", "branch"):
                v = _tokens(eng, "lud-verified", p, {"threshold": th, "k": 4, "layout": layout, "lookup": 0},
                            max_new_tokens=24, ignore_eos=True)
                assert T.replay_verified(x, greedy, cuts, conf, top, 4, th, ad.config.stop_id,
                                         branch=layout == "branch") == (24, v.figures().forward_passes), (p, layout)
