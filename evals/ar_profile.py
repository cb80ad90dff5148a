"""Per-step cost of `ar` outside the model forward, and where the forward spends its time (torch profiler):
`python evals/ar_profile.py [TOKENS]` on the default model (default 256 new tokens; figures in BENCHMARKS.md)."""
import sys, time, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from paradec.engine import Engine
from paradec.strategies import Request, get
e = Engine.load(None)
orig = e.forward
fwd = []
def timed(*a, **k):
    t = time.perf_counter(); r = orig(*a, **k); fwd.append(time.perf_counter() - t); return r
e.forward = timed
N = int(sys.argv[1]) if len(sys.argv) > 1 else 256
req = Request(prompt="Write a Python function that merges two sorted lists, with a docstring and comments.", max_new_tokens=N, ignore_eos=True)
list(get("ar").stream(e, Request(prompt="hi", max_new_tokens=4)))
fwd.clear()
steps = []; g = get("ar").stream(e, req)
while True:
    t = time.perf_counter()
    try: s = next(g)
    except StopIteration: break
    steps.append(time.perf_counter() - t)
tot, f = sum(steps[1:]), sum(fwd[1:])
print(f"ar {N} tokens: step {1000*tot/len(steps[1:]):.1f} ms, forward {1000*f/len(fwd[1:]):.1f} ms, outside forward {100*(tot-f)/tot:.2f}% of step time")
from torch.profiler import profile, ProfilerActivity
e.forward = orig
cache = e.new_cache(); ids = e.encode(req); e.forward(ids, cache, logits_to_keep=1)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for i in range(10):
        e.forward([100 + i], cache, logits_to_keep=1)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
