#!/usr/bin/env python3
"""Load benchmark of `gizllm serve` against `gizllm bench`, for machines without node.

    python3 bench/server/load.py --model DIR [--device cuda] [--clients 64,256] [--window 20]
        [--output-tokens 128] [--prompt-words 40] [--slots N] [--gizllm PATH] [--json]

The same measurement as load.mjs, with the standard library only (the GPU machine has Python
but no node): each point starts a fresh server, runs `clients` closed-loop clients on loopback,
each sending one streamed /v1/chat/completions after another (greedy, max_tokens
--output-tokens with ignore_eos), request n about "item n". A warm-up lasts until every client
has finished one request, then a window of --window seconds; everything is counted by when it
arrived in the window: output tokens/s, requests/s, time to first token, inter-token latency
(gaps between two arrivals of one answer). The offline peer is `gizllm bench --prompts` with the
token ids of the same chats (read back from the server's /tokenize), the same output tokens and
concurrency min(clients, slots).
"""
import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

WORDS = ("the a river of light runs under old stone bridges where quiet people walk at night "
         "and count the boats that carry bread wine and letters to towns along the water while "
         "children watch from windows and the bells of distant churches ring for hours").split()


def messages(n, prompt_words):
    words = [WORDS[(n * 13 + i * 7) % len(WORDS)] for i in range(prompt_words)]
    return [{"role": "user", "content": f"Tell me about item {n}: {' '.join(words)}."}]


def start_server(a):
    cmd = [a.gizllm, "serve", "--model", a.model, "--port", "0", "--device", a.device,
           "--max-pending", "4096"]
    if a.slots:
        cmd += ["--slots", str(a.slots)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    text = ""
    deadline = time.time() + 600
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError(f"server exited {proc.wait()}: {text}")
        text += line
        m = re.search(r"on http://[\d.]+:(\d+)", text)
        if m:
            # Keep reading stderr so that the server never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, int(m.group(1)), text
    raise RuntimeError("server did not start: " + text)


def post(port, route, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", route, json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"{route}: {r.status} {data[:300]}")
    return json.loads(data)


def events(r):
    """The parsed chunks of a streamed response, as they arrive (server-sent events)."""
    buffer = b""
    while True:
        chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not chunk:
            return
        buffer += chunk
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            if event.startswith(b"data: ") and event != b"data: [DONE]":
                yield json.loads(event[6:])


def percentile(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))]


class Point:
    def __init__(self):
        self.lock = threading.Lock()
        self.events = []  # (time, tokens) of every arrival
        self.ttft = []  # (time of first token, seconds since sent)
        self.gaps = []  # (time, seconds since the answer's previous arrival)
        self.done = []  # times answers ended
        self.errors = []
        self.finished_one = set()


def client(port, index, a, point, stop):
    n = index
    conn = None
    while not stop.is_set():
        body = json.dumps({"messages": messages(n, a.prompt_words), "max_tokens": a.output_tokens,
                           "temperature": 0, "stream": True, "ignore_eos": True,
                           "stream_options": {"include_usage": True}})
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            sent = time.perf_counter()
            conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
            r = conn.getresponse()
            if r.status != 200:
                point.errors.append(f"status {r.status}")
                r.read()
                continue
            counted, last = 0, None
            for c in events(r):
                now = time.perf_counter()
                tokens = 0
                if c.get("usage"):
                    tokens = max(0, c["usage"]["completion_tokens"] - counted)
                elif c.get("choices") and (c["choices"][0].get("delta") or {}).get("content"):
                    tokens = 1
                if tokens == 0:
                    continue
                counted += tokens
                with point.lock:
                    point.events.append((now, tokens))
                    if last is None:
                        point.ttft.append((now, now - sent))
                    else:
                        point.gaps.append((now, now - last))
                last = now
            with point.lock:
                point.done.append(time.perf_counter())
                point.finished_one.add(index)
        except Exception as e:  # noqa: BLE001 (a failed request is counted, the client goes on)
            if not stop.is_set():
                point.errors.append(str(e))
            conn = None
        n += a.clients_now


def run_point(a, clients):
    proc, port, log = start_server(a)
    try:
        a.clients_now = clients
        point, stop = Point(), threading.Event()
        threads = [threading.Thread(target=client, args=(port, i, a, point, stop), daemon=True)
                   for i in range(clients)]
        for t in threads:
            t.start()
        while len(point.finished_one) < clients and not point.errors:
            time.sleep(0.05)
        t0 = time.perf_counter()
        time.sleep(a.window)
        t1 = time.perf_counter()
        stop.set()
        inside = lambda xs: [v for (t, v) in xs if t0 <= t < t1]  # noqa: E731
        tokens = sum(inside(point.events))
        result = {
            "clients": clients, "server": True, "window_s": t1 - t0,
            "output_tokens_per_s": tokens / (t1 - t0),
            "requests_per_s": sum(1 for t in point.done if t0 <= t < t1) / (t1 - t0),
            "ttft_p50_ms": 1e3 * percentile(inside(point.ttft), 0.5),
            "ttft_p99_ms": 1e3 * percentile(inside(point.ttft), 0.99),
            "itl_p50_ms": 1e3 * percentile(inside(point.gaps), 0.5),
            "itl_p99_ms": 1e3 * percentile(inside(point.gaps), 0.99),
            "errors": len(point.errors),
        }
        ids = [post(port, "/tokenize", {"messages": messages(n, a.prompt_words)})["tokens"]
               for n in range(max(16, 6 * min(clients, a.slots or clients)))]
    finally:
        proc.terminate()
        proc.wait()
    return result, ids


def run_offline(a, clients, ids):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for row in ids:
            f.write(json.dumps({"tokens": row}) + "\n")
        path = f.name
    concurrency = min(clients, a.slots or clients)
    cmd = [a.gizllm, "bench", "--model", a.model, "--device", a.device, "--json", "--prompts", path,
           "-n", str(len(ids)), "-c", str(concurrency), "-o", str(a.output_tokens)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    os.unlink(path)
    if out.returncode != 0:
        return {"clients": clients, "server": False, "error": out.stderr[-300:]}
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {"clients": clients, "server": False, "concurrency": concurrency,
            "output_tokens_per_s": r["output_tokens_per_s"], "ttft_p50_ms": r["ttft_p50_ms"],
            "itl_p50_ms": r["itl_p50_ms"], "itl_p99_ms": r["itl_p99_ms"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--clients", default="64,256")
    p.add_argument("--window", type=float, default=20)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--prompt-words", type=int, default=40)
    p.add_argument("--slots", type=int, default=0, help="0: the server's own default")
    p.add_argument("--gizllm", default=os.environ.get("GIZLLM", "build/gizllm"))
    p.add_argument("--no-offline", action="store_true")
    p.add_argument("--json", action="store_true", help="one JSON object a line")
    a = p.parse_args()
    for clients in [int(c) for c in a.clients.split(",")]:
        result, ids = run_point(a, clients)
        rows = [result] + ([] if a.no_offline else [run_offline(a, clients, ids)])
        for r in rows:
            if a.json:
                print(json.dumps(r), flush=True)
            else:
                print(("serve  " if r["server"] else "bench  ") + ", ".join(
                    f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()
                    if k != "server"), flush=True)


if __name__ == "__main__":
    sys.exit(main())
