"""`lud`: Lexical Unit Decoding (Sun et al., LREC-COLING 2024, arXiv 2405.15208). Lossy.

Each step is one forward pass over  [tokens accepted last step] + [k-1 pad slots]  (positions continue
after the last real token; causal attention, so the pad slots see the whole context and the earlier pads):

* the logits at the last real position are the base model's own (the adapter is gated to pad slots, see
  paradec/lud.py and paradec/adapters.py): the first token is picked from them exactly as `ar` picks it -
  argmax when greedy, the request's u stream (u_i for output token i) when sampling - and is always accepted;
* pad slot j predicts the token j places after it. Slots are read in order and accepted while the slot's
  top class has probability (softmax of the raw logits plus the adapter's STOP class) strictly above
  `threshold`, is not STOP ("the lexical unit ended"), and passes the repetition rule; the first refused
  slot ends the step. Pad tokens are
  always the slot's argmax, also under sampling.
* repetition rule: with `max_repeat` = n > 0, a pad token equal to each of the previous n output tokens
  is refused (no run of more than n identical tokens is created by pad predictions; the base model's own
  first token is never refused).

The pad slots are then cropped out of the KV cache; the accepted tokens are fed as real inputs on the next
pass. `threshold` 1.0 never accepts a pad prediction, so the output is exactly `ar`'s. Pad slots are
not drafted past the request's remaining token budget.
Step figures: forward_passes 1, drafted = pad predictions considered, accepted = those accepted.
"""
from __future__ import annotations

import torch

from ..lud import AdapterError, LUDAdapter
from ..sampling import next_tokens
from .base import Param, RequestError, Run, Strategy, register, trained_availability


# On a float32 CPU (AVX2) a pass over 2 tokens costs what a 1-token pass does, one over 5-9 tokens 1.2-1.9x
# (docs/bench/forward_cost.md, draft_cost.md), while the default model's parameters gain little from the slots
# after the first: held-out tokens per pass at threshold 0.9 are 1.17 with k=2 and 1.20 with k=5 (their card,
# teacher-forced on held-out training prompts). So there the auto k is 2; elsewhere the parameters' own k.
CPU_FP32_K = 2


def auto_k(engine, adapter: LUDAdapter, k: int) -> int:
    """The `k` parameter, or with 0 (auto) CPU_FP32_K on a float32 CPU and the parameters' own k elsewhere."""
    fp32_cpu = engine.device.type == "cpu" and engine.dtype == torch.float32
    return k or (CPU_FP32_K if fp32_cpu else adapter.config.k)


@register
class LexicalUnits(Strategy):
    name = "lud"
    title = "Lexical Unit Decoding (LUD)"
    lossless = False
    params = {
        "k": Param(0, int, 0, 16, f"tokens per pass at most: 1 real + k-1 pad slots (0: auto - the parameters' own "
                                  f"k, {CPU_FP32_K} on a float32 CPU)"),
        "threshold": Param(0.9, float, 0.0, 1.0, "accept a pad prediction when its probability exceeds this "
                                                 "(1.0 = never: exactly ar)"),
        "max_repeat": Param(3, int, 0, 64, "refuse a pad token equal to the previous n tokens (0 = off)"),
        "adapter": Param("", str, help="folder with LUD parameters (default: <model folder>/lud)"),
    }

    def available(self, engine) -> tuple[bool, str]:
        return trained_availability("the LUD parameters", lambda: LUDAdapter.find(engine), lambda ad: True,
                                    LUDAdapter.hint(engine))    # find refuses parameters made for another model

    def attach(self, run: Run) -> LUDAdapter:
        """The request's LUD parameters, their hooks held on the model for this generation."""
        try:
            return run.hold(LUDAdapter.require(run.engine, run.params["adapter"] or None).attached(run.engine.model))
        except (AdapterError, FileNotFoundError) as e:
            raise RequestError(f"{self.name}: {e}") from e

    def steps(self, run: Run):
        engine, p, out, cache = run.engine, run.params, run.out, run.cache
        adapter = self.attach(run)
        threshold, max_rep = p["threshold"], p["max_repeat"]
        k = auto_k(engine, adapter, p["k"])
        sp, us = run.sampling, run.us
        feed = list(run.ids)
        prefill = True
        while True:
            n_pad = max(0, min(k - 1, out.budget - len(out.ids) - 1))
            cached = engine.cache_len(cache)
            tokens = feed + [engine.pad_id] * n_pad
            gate = torch.zeros(len(tokens), dtype=torch.bool)
            gate[len(feed):] = True
            with adapter.gated(gate):
                logits = engine.forward(tokens, cache, logits_to_keep=n_pad + 1, upcast=False)[0]
            V = logits.shape[-1] - 1        # the applied adapter adds column V: its STOP class
            first = int(next_tokens(logits[0, :V], sp, us[len(out.ids)] if us else None))
            new = [first]
            if n_pad:
                probs = torch.softmax(logits[1:].float(), -1)
                conf, top = probs.max(-1)
                for c, t in zip(conf.tolist(), top.tolist()):
                    hist = out.ids + new
                    if c <= threshold or t == V or (max_rep and len(hist) >= max_rep
                                                          and all(h == t for h in hist[-max_rep:])):
                        break
                    new.append(t)
                engine.crop(cache, cached + len(feed))
            step = out.step(new, forward_passes=1, drafted=n_pad, accepted=len(new) - 1, prefill=prefill)
            yield step
            if out.done:
                return
            prefill = False
            feed = new
