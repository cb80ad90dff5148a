"""`hf-generate`: the peer - transformers' own `model.generate`, run as one step, to bench against."""
from __future__ import annotations

import torch

from .. import kernels
from .base import Param, Run, Strategy, register


@register
class HFGenerate(Strategy):
    name = "hf-generate"
    title = "transformers generate (peer)"
    lossless = True
    params = {"assistant": Param(False, bool, help="use the draft model as assistant_model"),
              "prompt_lookup_num_tokens": Param(0, int, 0, 64, help="transformers' prompt lookup")}

    def steps(self, run: Run):
        engine, request, p, ids = run.engine, run.request, run.params, run.ids
        # the same stop tokens as every other strategy (the model profile's, not only the generation config's)
        kw = dict(max_new_tokens=request.max_new_tokens, pad_token_id=engine.pad_id, eos_token_id=sorted(engine.eos_ids))
        if request.sampling.greedy:
            kw.update(do_sample=False)
        else:
            torch.manual_seed(request.seed)
            kw.update(do_sample=True, temperature=request.temperature, top_k=request.top_k or None,
                      top_p=request.top_p)
        if request.ignore_eos:
            kw.update(eos_token_id=None, min_new_tokens=request.max_new_tokens)
        if p["assistant"]:
            from .speculative import draft_model
            kw["assistant_model"] = draft_model(engine, request).model
        if p["prompt_lookup_num_tokens"]:
            kw["prompt_lookup_num_tokens"] = p["prompt_lookup_num_tokens"]
        x = torch.tensor([ids], device=engine.device)
        # the prompt's rows get the numbers every paradec strategy's first pass gives them (kernels.prompt_rows)
        with torch.inference_mode(), kernels.prompt_passes(engine.model, len(ids)):
            gen = engine.model.generate(input_ids=x, attention_mask=torch.ones_like(x), **kw)
        new = gen[0, len(ids):].tolist()
        # plain generate: one pass per token; assisted / prompt lookup: transformers does not report its passes
        plain = not (p["assistant"] or p["prompt_lookup_num_tokens"])
        yield run.out.step(new, forward_passes=len(new) if plain else 0, prefill=True,
                       info={} if plain else {"note": "forward passes not reported by transformers"})


@register
class HFAssisted(HFGenerate):
    """The peer of `sps`: transformers' assisted generation with the same draft model."""
    name = "hf-assisted"
    title = "transformers generate(assistant_model=draft) (peer)"
    params = {"assistant": Param(True, bool, help="use the draft model as assistant_model"),
              "prompt_lookup_num_tokens": Param(0, int, 0, 64, help="transformers' prompt lookup")}

    def available(self, engine):
        from .speculative import SpeculativeSampling
        return SpeculativeSampling().available(engine)


@register
class HFPromptLookup(HFGenerate):
    """The peer of `pld`: transformers' prompt lookup decoding."""
    name = "hf-pld"
    title = "transformers generate(prompt_lookup_num_tokens=10) (peer)"
    params = {"assistant": Param(False, bool, help="use the draft model as assistant_model"),
              "prompt_lookup_num_tokens": Param(10, int, 1, 64, help="transformers' prompt lookup")}
