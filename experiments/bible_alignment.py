"""How many Bible pairs the independent chrF check flags, pairing by verse id against
pairing by content (jaxformer_lab.bible.load), for wyc-web and asv-web: every held-out
pair and 2,000 random training pairs. See docs/data.md, "An independent check".

    python experiments/bible_alignment.py
"""

import random

from jaxformer_lab import bible

for name in ("wyc-web", "asv-web"):
    src, tgt = name.split("-")
    S, T = bible.load_verses(src), bible.load_verses(tgt)
    corpus = bible.load(name)
    skip = bible.NUMBERED_DIFFERENTLY.get(src, {})
    by_id = [
        (v, S.text[v], T.text[v])
        for v in sorted(S.text.keys() & T.text.keys())
        if S.text[v]
        and T.text[v]
        and v not in S.garbled | T.garbled
        and bible.book_of(v) not in skip
    ]
    now = [p for split in corpus.splits.values() for p in split]
    for label, pairs in (("by verse id (before)", by_id), ("aligned (now)", now)):
        held = [p for p in pairs if bible.split_of(p[0]) != "train"]
        train = [p for p in pairs if bible.split_of(p[0]) == "train"]
        sample = random.Random(0).sample(train, 2000)
        print(
            name,
            label,
            "held-out flagged",
            len(bible.misaligned(tgt, held)),
            "of",
            len(held),
            "| training sample flagged",
            len(bible.misaligned(tgt, sample)),
            "of",
            len(sample),
        )
