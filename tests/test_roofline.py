"""The read-bandwidth roofline: weight bytes per token as defined in paradec.roofline, the probe, the bench line."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from paradec import bench as B
from paradec import roofline as R
from paradec.store import Store

from conftest import ROOT, random_engine

V, H, L, I, HEADS, KV, HD = 1000, 32, 3, 48, 4, 2, 8


def _model(tied: bool, dtype=torch.float32):
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, num_hidden_layers=L, intermediate_size=I,
                      num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=HD, max_position_embeddings=64,
                      tie_word_embeddings=tied)
    return LlamaForCausalLM(cfg).to(dtype).eval()


def _expected_params(tied: bool) -> int:
    """Parameters read per token, from the config numbers alone."""
    attn = H * HEADS * HD + 2 * H * KV * HD + HEADS * HD * H      # q, k, v, o (no biases)
    mlp = 3 * H * I                                               # gate, up, down
    per_layer = attn + mlp + 2 * H                                # two RMSNorms
    body = L * per_layer + H                                      # final norm
    head = V * H                                                  # the LM head, read whole
    embed = 0 if tied else H                                      # untied table: one row per token
    return body + head + embed


@pytest.mark.parametrize("tied", [True, False])
def test_weight_bytes_tied_and_untied(tied):
    m = _model(tied)
    assert R.weight_bytes_per_token(m) == 4 * _expected_params(tied)
    every = sum(p.numel() * p.element_size() for p in m.parameters())
    # tied: every parameter once; untied: all but V-1 rows of the input table
    assert every - R.weight_bytes_per_token(m) == (0 if tied else 4 * (V - 1) * H)


def test_untied_costs_one_row_more_than_tied():
    assert R.weight_bytes_per_token(_model(False)) - R.weight_bytes_per_token(_model(True)) == 4 * H


@pytest.mark.parametrize("tied", [True, False])
def test_dtype_halves_the_bytes(tied):
    fp32, bf16 = R.weight_bytes_per_token(_model(tied)), R.weight_bytes_per_token(_model(tied, torch.bfloat16))
    assert fp32 == 2 * bf16 and bf16 == 2 * _expected_params(tied)


@pytest.mark.skipif(not __import__("paradec.native").native.available(), reason="native kernel not available")
def test_native_linears_count_the_copy_they_read():
    """A float32 model holding bfloat16 numbers (a float32 load of a bf16 checkpoint, as the default on an AVX2 CPU):
    the native kernel reads bf16 copies, so its linears count 2 bytes a weight; the norms stay float32. The kernel
    pads outputs to blocks of 16 and reads the padding: the head's 1000 rows count as 1008."""
    from paradec import kernels
    m = _model(True)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    kernels.native_linears(m)
    norms = L * 2 * H + H
    assert R.weight_bytes_per_token(m) == 4 * norms + 2 * (_expected_params(True) - norms + 8 * H)
    kernels.unnative_linears(m)
    assert R.weight_bytes_per_token(m) == 4 * _expected_params(True)


def test_kv_bytes_from_config():
    cfg = _model(True).config
    assert R.kv_bytes_per_context_token(cfg, 2) == 2 * L * KV * HD * 2
    assert R.kv_bytes_per_token(cfg, 100, 4) == 2 * L * KV * HD * 100 * 4
    assert R.mean_context(40, 20) == 50


def test_tiny_engine_is_tied_so_every_parameter_counts(tiny_engine):
    m = tiny_engine.model
    assert m.get_input_embeddings().weight is m.get_output_embeddings().weight
    assert R.weight_bytes_per_token(m) == sum(p.numel() * p.element_size() for p in m.parameters())


def test_bandwidth_probe_small_buffer():
    bw = R.read_bandwidth("cpu", nbytes=16 << 20, runs=2, min_time_s=0.005)
    assert math.isfinite(bw) and bw > 0


def test_probe_on_engine_and_threads_restored(tiny_engine):
    before = torch.get_num_threads()
    R.read_bandwidth("cpu", nbytes=4 << 20, runs=1, threads=1, min_time_s=0.001)
    assert torch.get_num_threads() == before
    rf = R.probe(tiny_engine, nbytes=8 << 20, runs=2)
    assert rf["bandwidth_gbs"] > 0 and rf["probe_bytes"] == 8 << 20
    assert rf["weight_bytes_per_token"] == R.weight_bytes_per_token(tiny_engine.model)
    c = tiny_engine.model.config
    assert rf["kv_bytes_per_context_token"] == 2 * c.num_hidden_layers * c.num_key_value_heads * \
        (c.hidden_size // c.num_attention_heads) * 4
    assert R.probe_bytes("cpu", 10) >= min(1 << 30, R._free_bytes(torch.device("cpu")) // 2)


def test_roofline_formula():
    r = R.roofline(10.0, 1.5e9, 0.5e9, decode_tokens_per_s=4.0, e2e_tokens_per_s=3.0)
    assert r["bytes_per_token"] == 2e9 and r["roofline_tokens_per_s"] == pytest.approx(5.0)
    assert r["fraction"] == pytest.approx(0.8) and r["e2e_fraction"] == pytest.approx(0.6)
    r["mean_context"] = 12
    assert R.line(r).startswith("ar at 80% of the 5.0 tok/s read-bandwidth roofline (10.0 GB/s, 2.00 GB/token")
    assert R.roofline(10.0, 1e9)["fraction"] is None
    assert B.roofline_summary(None, None) is None


def test_summary_counts_multi_turn_context(tiny_engine):
    import pandas as pd
    item = B.BenchItem("x", "chat", ["first question", "second question"])
    df = pd.DataFrame([dict(strategy="ar", item_key="x", repeat=0, turn=t, prompt=item.turns[t], text="an answer",
                            n_tokens=10, tpot_s=0.01, tokens_per_s=80.0, error=None) for t in (0, 1)])
    rf = {"bandwidth_gbs": 20.0, "weight_bytes_per_token": 1e6, "kv_bytes_per_context_token": 100}
    s = B.roofline_summary(rf, df, tiny_engine, [item])
    p0 = len(tiny_engine.encode(B.Request(prompt="first question")))
    p1 = len(tiny_engine.encode(B.Request(prompt="second question", messages=[
        {"role": "user", "content": "first question"}, {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "second question"}])))
    assert p1 > p0 and s["mean_context"] == pytest.approx((p0 + p1) / 2 + 5)
    assert s["decode_tokens_per_s"] == pytest.approx(100.0) and s["e2e_tokens_per_s"] == 80.0
    assert s["fraction"] == pytest.approx(100.0 / (20e9 / (1e6 + 100 * s["mean_context"])))
    no_kv = B.roofline_summary(rf, df)           # no engine: KV excluded, and the line says so
    assert not no_kv["kv_included"] and "KV-cache reads excluded" in B.roofline_line(no_kv)


def _cli(*args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "paradec", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=300)


def test_bench_measures_bandwidth_and_prints_the_roofline(model_dir, tmp_path):
    db, md = tmp_path / "r.db", tmp_path / "r.md"
    p = _cli("bench", "--model", str(model_dir), "--suite", "code", "--limit", "2", "--strategies", "ar",
             "--max-new-tokens", "12", "--ignore-eos", "--no-perplexity", "--db", str(db), "--markdown", str(md),
             "--dtype", "float32")          # as the random model is made (auto is bf16 on a CPU with avx512_bf16)
    assert p.returncode == 0, p.stderr
    assert "read bandwidth" in p.stderr
    line = next(x for x in p.stdout.splitlines() if "read-bandwidth roofline" in x)
    assert line.startswith("ar at ") and "GB/s" in line and "decode" in line and "E2E" in line
    assert "- roofline: ar at " in md.read_text()
    store = Store(f"sqlite:///{db}")
    env = store.list_runs()[0]["environment"]
    rf = env["roofline"]
    assert math.isfinite(rf["bandwidth_gbs"]) and rf["bandwidth_gbs"] > 0
    assert rf["threads"] == 1 and rf["probe_bytes"] >= 1 << 20
    engine = random_engine(5)
    assert rf["weight_bytes_per_token"] == R.weight_bytes_per_token(engine.model)
    # the summary recomputed from the stored rows: KV counted at ar's mean context
    run_id = store.list_runs()[0]["id"]
    s = B.roofline_summary(rf, store.results_dataframe([run_id]), engine,
                           B.items_from_store(store, store.list_runs()[0]["eval_set_id"]))
    assert s["kv_included"] and s["mean_context"] > 6 and s["kv_bytes_per_token"] > 0
    assert 0 < s["fraction"] and s["roofline_tokens_per_s"] == pytest.approx(
        rf["bandwidth_gbs"] * 1e9 / (rf["weight_bytes_per_token"] + s["kv_bytes_per_token"]))


def test_bench_no_roofline(model_dir, tmp_path):
    db = tmp_path / "n.db"
    p = _cli("bench", "--model", str(model_dir), "--suite", "code", "--limit", "1", "--strategies", "ar",
             "--max-new-tokens", "4", "--no-perplexity", "--no-roofline", "--db", str(db), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1])["roofline"] is None
    assert "roofline" not in Store(f"sqlite:///{db}").list_runs()[0]["environment"]
