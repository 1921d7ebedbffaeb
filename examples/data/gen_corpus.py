#!/usr/bin/env python3
"""Writes tiny_corpus.txt: ~200 KB of simple, learnable English-like text (a seeded grammar), so
the examples and tests train offline. Deterministic: rerunning reproduces the checked-in file.

  python3 examples/data/gen_corpus.py > examples/data/tiny_corpus.txt
"""
import random

rng = random.Random(5)
ADJ = "small quiet bright old young red green heavy gentle clever brave tired happy".split()
NOUN = "cat dog bird river tree child farmer teacher ship garden city mountain robot lamp".split()
VERB = "sees finds follows carries watches builds paints moves helps remembers".split()
PLACE = "near the river|in the garden|under the tree|on the hill|by the sea|inside the house".split("|")
TIME = "in the morning|at night|after the rain|before dinner|every day|once again".split("|")


def np():
    return f"the {rng.choice(ADJ)} {rng.choice(NOUN)}" if rng.random() < 0.6 else f"the {rng.choice(NOUN)}"


def sentence():
    s = f"{np()} {rng.choice(VERB)} {np()}"
    if rng.random() < 0.5:
        s += " " + rng.choice(PLACE)
    if rng.random() < 0.3:
        s += " " + rng.choice(TIME)
    if rng.random() < 0.2:
        s += f" and {np()} {rng.choice(VERB)} it"
    return s[0].upper() + s[1:] + "."


out, size = [], 0
while size < 200_000:
    para = " ".join(sentence() for _ in range(rng.randint(3, 7))) + "\n\n"
    out.append(para)
    size += len(para)
print("".join(out), end="")
