"""Can a configuration of the regime frontier learn its task? Supervised carry-chain warm-up of a fresh tiny Llama,
printing the loss, the dev exact accuracy and the graded reward every 150 steps (up to 3,000; stops at 30% accuracy).

    OMP_NUM_THREADS=1 python benchmarks/warm_probe.py DIGITS HIDDEN LAYERS LR
    OMP_NUM_THREADS=1 python benchmarks/warm_probe.py 7 128 2 3e-3 \
        | tee benchmarks/results/peer_gain_wall-warm-probe-d7.txt
"""

import sys
import time

import torch

from trl_ftis.demo.tiny import build_char_tokenizer, build_tiny_causal_lm
from trl_ftis.tasks.addition import greedy_texts
from trl_ftis.tasks.carry_chain import (
    CARRY_CHAIN_ALPHABET,
    carry_chain_problems,
    carry_chain_reward,
    final_answer,
    max_chain_tokens,
)

torch.set_num_threads(1)
D = int(sys.argv[1])
H = int(sys.argv[2])
L = int(sys.argv[3])
lr = float(sys.argv[4])
tok = build_char_tokenizer(alphabet=CARRY_CHAIN_ALPHABET)
dev = carry_chain_problems(100, seed=2000, split="dev", digits=D)
probs = carry_chain_problems(20000, seed=1000, split="train", digits=D, exclude={p["prompt"] for p in dev})
m = build_tiny_causal_lm(tok, hidden_size=H, num_layers=L, seed=0, max_position_embeddings=160)
opt = torch.optim.AdamW(m.parameters(), lr=lr)
g = torch.Generator().manual_seed(0)
pad, eos = tok.pad_token_id, tok.eos_token_id
enc = [
    (
        tok(p["prompt"], add_special_tokens=False)["input_ids"],
        tok(p["chain"], add_special_tokens=False)["input_ids"] + [eos],
    )
    for p in probs
]
t = time.time()
for step in range(1, 3001):
    idx = torch.randint(len(enc), (64,), generator=g).tolist()
    rows = [enc[i] for i in idx]
    w = max(len(a) + len(b) for a, b in rows)
    ids = torch.full((64, w), pad)
    lab = torch.full((64, w), -100)
    att = torch.zeros((64, w), dtype=torch.long)
    for r, (a, b) in enumerate(rows):
        x = a + b
        ids[r, : len(x)] = torch.tensor(x)
        att[r, : len(x)] = 1
        lab[r, len(a) : len(x)] = torch.tensor(b)
    loss = m(input_ids=ids, attention_mask=att, labels=lab).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step % 150 == 0:
        m.eval()
        texts = greedy_texts(m, tok, [p["prompt"] for p in dev], max_new_tokens=max_chain_tokens(D))
        m.train()
        acc = sum(";" in x and final_answer(x) == p["answer"] for x, p in zip(texts, dev)) / len(dev)
        rew = sum(carry_chain_reward(texts, [p["answer"] for p in dev], [p["chain"] for p in dev])) / len(dev)
        print(
            f"step {step} loss {loss.item():.3f} dev acc {acc:.2f} reward {rew:.3f} ({time.time() - t:.0f} s)",
            flush=True,
        )
        if acc >= 0.3:
            break
