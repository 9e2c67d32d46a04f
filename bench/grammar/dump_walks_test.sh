#!/usr/bin/env bash
# grammar_bench --dump-walks: a line a document, the same walks with the same seed, as many masks
# as the run timed (a time each), and each walk's tokens decode to the document: a whole one parses
# as JSON.
#   dump_walks_test.sh GRAMMAR_BENCH   (from the repository root)
set -euo pipefail
bench=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/schemas"
for f in $(ls tests/grammar/schemas/*.json | head -4); do cp "$f" "$tmp/schemas/"; done
run() { "$bench" --tokenizer models/tiny-chat/tokenizer.json --schemas "$tmp/schemas" --docs 3 "$@"; }
run --dump-walks "$tmp/a.jsonl" > "$tmp/a.json"
run --dump-walks "$tmp/b.jsonl" > /dev/null
run > "$tmp/plain.json"
python3 - "$tmp" <<'PY'
import json, os, sys
tmp = sys.argv[1]
tok = json.load(open("models/tiny-chat/tokenizer.json"))
vocab = {i: s for s, i in tok["model"]["vocab"].items()}
# byte-level BPE: each byte is one character of the token's text
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
byte = {chr(c): b for b, c in zip(bs, cs)}
walks = [json.loads(l) for l in open(f"{tmp}/a.jsonl")]
again = [json.loads(l) for l in open(f"{tmp}/b.jsonl")]
untimed = lambda w: {k: v for k, v in w.items() if k != "mask_us"}
assert [untimed(w) for w in walks] == [untimed(w) for w in again], "not the same walks"
files = sorted(os.listdir(f"{tmp}/schemas"))
assert [(w["file"], w["doc"]) for w in walks] == [(f, d) for f in files for d in range(3)], walks
stats = json.loads(open(f"{tmp}/a.json").read())
plain = json.loads(open(f"{tmp}/plain.json").read())
masks = sum(w["masks"] for w in walks)
assert stats["mask"]["count"] == masks == plain["mask"]["count"], (stats["mask"], masks)
whole = 0
for w in walks:
    assert w["masks"] == len(w["tokens"]) + 1 or w["masks"] == len(w["tokens"]) == 400, w
    assert len(w["mask_us"]) == w["masks"] and min(w["mask_us"]) >= 0, w
    text = b"".join(bytes(byte[c] for c in vocab[t]) for t in w["tokens"]).decode()
    if w["masks"] == len(w["tokens"]) + 1:  # the walk stopped on a whole document
        json.loads(text)
        whole += 1
assert whole > 0
print(f"ok: {len(walks)} walks, {masks} masks, {whole} whole documents")
PY
