#!/usr/bin/env python3
"""A chat's second turn through `gizllm serve`: is only its new part read?

    python3 bench/server/chat_turns.py --model DIR [--device cuda] [--tokens 4000] [--answer 64]
        [--rounds 3] [--gizllm PATH] [--json]

Each round is one chat on a fresh topic: turn 1 is a user message of about --tokens prompt tokens
(streamed, greedy, --answer tokens with ignore_eos); turn 2 sends the same messages, the answer as
the assistant's message and a short new question. Beside it, a cold turn 2: the same messages with
one word changed at the start, so no earlier prefix matches and the whole prompt is read. The
figures: time to first token of turn 1, of turn 2 and of the cold turn 2, and each request's
prompt tokens and cached tokens (usage.prompt_tokens_details.cached_tokens). On a model with
recurrent layers a warm turn 2 can only skip what came before when the slot kept its states at the
end of turn 1's messages; the cached tokens say how much was skipped. Medians over the rounds.
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from load import WORDS, events, post, start_server  # noqa: E402


def passage(topic, words):
    return " ".join(WORDS[(topic * 31 + i * 7 + i // len(WORDS)) % len(WORDS)] for i in range(words))


def chat(port, messages, answer):
    """One streamed request: (seconds to the first token, answer text, usage)."""
    body = json.dumps({"messages": messages, "max_tokens": answer, "temperature": 0,
                       "stream": True, "ignore_eos": True,
                       "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    sent = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:300]}")
    first, text, usage = None, "", None
    for c in events(r):
        if c.get("usage"):
            usage = c["usage"]
        for choice in c.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                if first is None:
                    first = time.perf_counter() - sent
                text += piece
    conn.close()
    return first, text, usage


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens", type=int, default=4000, help="turn 1's prompt tokens (about)")
    p.add_argument("--answer", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--gizllm", default="build/gizllm")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    proc, port, _ = start_server(a)
    rows = []
    try:
        # Words for about --tokens prompt tokens, from the tokens of a sample.
        sample = [{"role": "user", "content": passage(0, 1000)}]
        per_word = len(post(port, "/tokenize", {"messages": sample})["tokens"]) / 1000
        words = max(1, int(a.tokens / per_word))
        # A warm-up chat (first requests pay one-off costs: recordings, allocations).
        chat(port, [{"role": "user", "content": passage(99, 200)}], 8)
        for rnd in range(a.rounds):
            first = [{"role": "user", "content": f"Topic {rnd}. " + passage(rnd + 1, words)}]
            t1, answer, u1 = chat(port, first, a.answer)
            second = first + [{"role": "assistant", "content": answer},
                              {"role": "user", "content": "Now say that again in fewer words."}]
            t2, _, u2 = chat(port, second, a.answer)
            cold = [dict(second[0], content="Subject" + second[0]["content"][5:])] + second[1:]
            t3, _, u3 = chat(port, cold, a.answer)
            cached = lambda u: (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)  # noqa: E731
            rows.append({"turn1_ms": 1e3 * t1, "turn1_prompt": u1["prompt_tokens"],
                         "turn1_cached": cached(u1),
                         "turn2_ms": 1e3 * t2, "turn2_prompt": u2["prompt_tokens"],
                         "turn2_cached": cached(u2),
                         "cold2_ms": 1e3 * t3, "cold2_prompt": u3["prompt_tokens"],
                         "cold2_cached": cached(u3)})
    finally:
        proc.terminate()
        proc.wait()
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    if a.json:
        print(json.dumps({"rounds": rows, "median": med}))
    else:
        for r in rows:
            print(" ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                           for k, v in r.items()))
        print(f"median: turn 1 {med['turn1_ms']:.1f} ms ({med['turn1_prompt']:.0f} tokens), "
              f"turn 2 {med['turn2_ms']:.1f} ms ({med['turn2_prompt']:.0f} tokens, "
              f"{med['turn2_cached']:.0f} cached), cold turn 2 {med['cold2_ms']:.1f} ms "
              f"({med['cold2_cached']:.0f} cached): {med['cold2_ms'] / med['turn2_ms']:.2f}x")


if __name__ == "__main__":
    main()
