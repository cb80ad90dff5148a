"""One prepared GPU check (at most ~6 minutes on an H100/H200-class card). Not a test; CI has no GPU.

    python evals/gpu_check.py [--tokens 256] [--bandwidth-gbs 4800]

1. runs the lossless-equality tests with the engine on CUDA (the default model loads on cuda, bf16);
2. times `ar` at batch 1 on a randomly initialised Llama with an ~8B configuration (Llama-3-8B shapes) in bf16,
   EOS ignored, and prints tokens/s and the fraction of the memory-bandwidth roofline:
   weight bytes x tokens/s / device bandwidth.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--bandwidth-gbs", type=float, default=4800.0, help="device memory bandwidth (H200: 4800)")
    ap.add_argument("--skip-tests", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    if not a.skip_tests:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_ar.py", "tests/test_speculative.py",
                        "tests/test_engine.py", "-x"], cwd=ROOT, env=env, timeout=240)
    from transformers import LlamaConfig, LlamaForCausalLM

    from paradec.engine import Engine
    from paradec.race import run_alone
    from paradec.strategies import Request
    from paradec.testing import tokenizer_dir
    from transformers import AutoTokenizer
    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                      rope_theta=500000.0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    model.generation_config.eos_token_id = tok.eos_token_id
    engine = Engine(model, tok, name="random-llama-8b-shape")
    req = Request(prompt="def main():", chat=False, max_new_tokens=a.tokens, ignore_eos=True)
    run_alone(engine, "ar", Request(prompt="x", chat=False, max_new_tokens=8, ignore_eos=True))
    t = time.time()
    lane = run_alone(engine, "ar", req)
    f = lane.figures()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    roofline = weight_bytes * f.tokens_per_s / (a.bandwidth_gbs * 1e9)
    print(json.dumps({"device": torch.cuda.get_device_name(0), "params": sum(p.numel() for p in model.parameters()),
                      "tokens": f.tokens, "tokens_per_s": f.tokens_per_s, "ttft_s": f.ttft_s, "tpot_s": f.tpot_s,
                      "wall_s": time.time() - t, "weight_gb": weight_bytes / 1e9,
                      "roofline_fraction": roofline}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
