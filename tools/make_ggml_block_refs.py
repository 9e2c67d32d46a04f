#!/usr/bin/env python3
"""Writes reference values of ggml's block types, dequantized by llama.cpp's gguf-py.

For each block type gguf-py dequantizes (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS,
TQ1_0, TQ2_0), random blocks: every byte random, except the f16 scale fields, which are set to
finite values of moderate size (signed, spread over several binades, one a subnormal half), since
a random f16 may be an infinity or a NaN. gguf-py has no dequantizer for Q1_0 and Q2_0; their test
derives its values by hand from the layout (tests/unit/formats/ggml_blocks_test.cc).

Output (little-endian): "GGMLREF1", u32 record count, then per record u32 ggml type number,
u32 blocks, u32 bytes per block, u32 elements per block, the blocks' bytes, the float32 values.

Usage: PYTHONPATH=<llama.cpp>/gguf-py python3 tools/make_ggml_block_refs.py \
           --out tests/golden/ggml_blocks.bin
"""
import argparse
import struct

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize

# Byte offsets of the f16 fields in each block type (ggml-common.h's structs).
HALF_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_NL: [0],
    T.IQ4_XS: [0],
    T.TQ1_0: [52],
    T.TQ2_0: [64],
}


def moderate_halves(rng, n):
    """n finite f16 values of either sign between about 2^-14 and 4; the first is subnormal."""
    exps = rng.uniform(-14.0, 2.0, size=n)
    v = np.sign(rng.uniform(-1, 1, size=n)) * np.exp2(exps)
    v[0] = 3.0e-6  # below f16's smallest normal (6.1e-5)
    return v.astype(np.float16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=23)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    records = []
    for qtype, offsets in HALF_FIELDS.items():
        elements, block_bytes = GGML_QUANT_SIZES[qtype]
        blocks = 8 if elements == 256 else 24
        data = rng.integers(0, 256, size=(blocks, block_bytes), dtype=np.uint8)
        for off in offsets:
            halves = moderate_halves(rng, blocks)
            data[:, off:off + 2] = halves.view(np.uint8).reshape(blocks, 2)
        values = dequantize(data.reshape(1, -1), qtype).reshape(-1).astype(np.float32)
        assert values.size == blocks * elements
        assert np.all(np.isfinite(values)), qtype.name
        records.append(struct.pack("<4I", int(qtype), blocks, block_bytes, elements) +
                       data.tobytes() + values.astype("<f4").tobytes())
    with open(args.out, "wb") as f:
        f.write(b"GGMLREF1" + struct.pack("<I", len(records)) + b"".join(records))


if __name__ == "__main__":
    main()
