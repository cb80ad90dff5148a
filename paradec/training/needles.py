"""Retrieval queries for FocusLLM's trainer: synthetic facts hidden in a long memory, asked for at the end.

The repetition objective (paradec/training/focus_train.py) asks the local context to continue a span copied
from one chunk; a user's question over a long input looks different: "What is the code ...? Reply with the
number only." - the answer is in one chunk, the question only names it. These queries teach that case.

Three kinds, all written for training here (the wording, the names and the filler are not the long-context
suite's: its passkey sentences, "pass key" itself and its filler sentences do not occur):

* ``code``: one fact such as "The door code is 4817." put at a random place in the memory (text of the
  training corpus), asked for by name;
* ``owned``: several facts of one kind with owners ("The locker code for the blue van is 80314."), one per
  query, each in its own chunk, so the other chunks' candidates are distractors that look alike;
* ``listing``: the memory is a key/value listing (JSON, YAML-like, ``k = v`` or ``k -> v`` lines) of random
  keys and values; a query gives a key and asks for its value.

The answer (the target) is the value followed by the chat turn's end, after the chat template's assistant
opening: what the model says when it reads the fact in its own window and is asked to reply with the value
alone.
"""
from __future__ import annotations

import json
import random
import string

NAMES = ("door code", "access code", "secret number", "locker code", "PIN", "vault combination", "ticket number",
         "confirmation number", "serial number", "security code", "verification code", "order number",
         "lucky number", "room number", "badge number", "safe combination")
ADJ = ("red", "blue", "old", "north", "south", "quiet", "tall", "green", "small", "east", "wooden", "yellow")
NOUN = ("warehouse", "gate", "library", "garage", "van", "cellar", "office", "studio", "tower", "barn", "kiosk",
        "workshop", "boathouse", "pharmacy")
FACT = ("The {name} is {v}.", "Note that the {name} is {v}.", "Please remember this: the {name} is {v}.",
        "{Name}: {v}. Keep it in mind.", "Here is the {name}: {v}.", "The {name} you will need is {v}. Do not lose it.")
OWNED = ("The {name} for {owner} is {v}.", "For {owner}, the {name} is {v}.", "{Owner} has the {name} {v}.")
ASK = ("What is the {name}?", "Which {name} was mentioned in the text?", "Tell me the {name} from the text above.",
       "What was the {name} given earlier?", "Can you find the {name} in the text?")
ASK_OWNED = ("What is the {name} for {owner}?", "Which {name} belongs to {owner}?",
             "Tell me the {name} of {owner} from the text above.")
ONLY = ("Reply with the number only.", "Give only the digits.", "Just the number, please.",
        "Respond with all {k} digits, nothing more.", "Write the number alone.")
INTRO = ("Somewhere in the text below there is a {name}. Read everything; I will ask for it afterwards.\n\n",
         "The following text hides one {name} among many lines. Find it.\n\n", "")
LIST_INTRO = ("Below is a listing of keys and their values. I will ask for one of them at the end.\n\n",
              "Each line below pairs a key with a value. Read them all.\n\n", "")
ASK_KEY = ('Which value is stored under "{k}"? Reply with the value alone.',
           'Look up "{k}" in the listing above and give its value only.',
           'What does "{k}" map to? Only the value, please.',
           'Give the value for the key {k}. Nothing else.')


def _digits(rng: random.Random) -> str:
    k = rng.randint(4, 7)
    return str(rng.randint(1, 9)) + "".join(rng.choice(string.digits) for _ in range(k - 1))


def _token(rng: random.Random) -> str:
    style = rng.random()
    n = rng.randint(6, 10)
    alphabet = "0123456789abcdef" if style < 0.6 else (string.digits if style < 0.8 else
                                                        string.ascii_uppercase + string.digits)
    return "".join(rng.choice(alphabet) for _ in range(n))


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _insert(chunk: list[int], piece: list[int], rng: random.Random) -> list[int]:
    """`chunk` with `piece` at a random place, cut back to its length (the piece kept whole)."""
    c = len(chunk)
    j = rng.randint(0, c - len(piece))
    return (chunk[:j] + piece + chunk[j:])[:c]


def code_memory(tok, stream: list[int], n: int, c: int, queries: int, rng: random.Random, owned: bool):
    """(chunks, [(question, answer, source chunk)]): n chunks of c tokens of `stream` holding one fact (or, with
    `owned`, up to `queries` facts of one kind with distinct owners, each in its own chunk)."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    s = rng.randrange(0, len(stream) - n * c - 1)
    chunks = [stream[s + i * c: s + (i + 1) * c] for i in range(n)]
    name = rng.choice(NAMES)
    if not owned:
        v = _digits(rng)
        fact = enc(" " + rng.choice(FACT).format(name=name, Name=_cap(name), v=v) + " ")
        if len(fact) + 2 > c:
            return None
        i = rng.randrange(n)
        chunks[i] = _insert(chunks[i], fact, rng)
        intro = enc(rng.choice(INTRO).format(name=name))
        if intro and len(intro) + len(fact) < c and i:
            chunks[0] = (intro + chunks[0])[:c]
        qa = []
        for _ in range(queries):
            q = rng.choice(ASK).format(name=name) + " " + rng.choice(ONLY).format(k=len(v))
            qa.append((q, v, i))
        return chunks, qa
    owners = rng.sample([f"the {a} {b}" for a in ADJ for b in NOUN], min(queries, n))
    where = rng.sample(range(n), len(owners))
    qa = []
    for owner, i in zip(owners, where):
        v = _digits(rng)
        fact = enc(" " + rng.choice(OWNED).format(name=name, owner=owner, Owner=_cap(owner), v=v) + " ")
        if len(fact) + 2 > c:
            return None
        chunks[i] = _insert(chunks[i], fact, rng)
        qa.append((rng.choice(ASK_OWNED).format(name=name, owner=owner) + " " + rng.choice(ONLY).format(k=len(v)),
                   v, i))
    while len(qa) < queries:
        qa.append(rng.choice(qa))
    return chunks, qa


def listing_memory(tok, n: int, c: int, queries: int, rng: random.Random):
    """(chunks, [(question, answer, source chunk)]): a key/value listing cut into n chunks of c tokens; each query
    asks for a pair that lies whole inside one chunk."""
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    style = rng.choice(("json", "colon", "equals", "arrow"))
    line = {"json": '\n  {k}: {v},', "colon": "\n{k}: {v}", "equals": "\n{k} = {v}", "arrow": "\n{k} -> {v}"}[style]
    quote = json.dumps if style == "json" else str
    ids = enc(rng.choice(LIST_INTRO) + ("{" if style == "json" else ""))
    pairs = []                          # (key, value, start, end) in token positions of the listing
    while len(ids) < n * c:
        k, v = _token(rng), _token(rng)
        piece = enc(line.format(k=quote(k), v=quote(v)))
        pairs.append((k, v, len(ids), len(ids) + len(piece)))
        ids += piece
    ids = ids[:n * c]
    whole = [(k, v, a // c) for k, v, a, b in pairs if b <= n * c and a // c == (b - 1) // c]
    if not whole:
        return None
    chunks = [ids[i * c:(i + 1) * c] for i in range(n)]
    picks = rng.sample(whole, min(queries, len(whole)))
    while len(picks) < queries:
        picks.append(rng.choice(picks))
    return chunks, [(rng.choice(ASK_KEY).format(k=k), v, i) for k, v, i in picks]


def needle_memory(tok, stream: list[int], n: int, c: int, queries: int, rng: random.Random, kind: str | None = None):
    """One memory and its queries of a kind drawn at random (or `kind`): (kind, chunks, [(question, answer,
    source chunk)]); tries again when a drawn layout cannot hold its facts."""
    for _ in range(20):
        k = kind or rng.choice(("code", "owned", "listing"))
        got = (listing_memory(tok, n, c, queries, rng) if k == "listing"
               else code_memory(tok, stream, n, c, queries, rng, owned=k == "owned"))
        if got is not None:
            return (k, *got)
    raise ValueError(f"no retrieval memory fits {n} chunks of {c} tokens")
