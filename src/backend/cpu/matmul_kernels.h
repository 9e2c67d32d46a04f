// The per-instruction-set kernels behind CpuBackend::Matmul (internal to backend/cpu).
//
// Every kernel computes dot products of weight rows with activation rows, NW weight rows by MX
// activation rows at a time, so that each weight byte loaded is used for MX rows (prefill) and
// the weights stream once at memory bandwidth (decode, MX = 1). Weights are read in blocks of
// kBlock inputs as two vectors; for bf16 the two vectors hold the even and the odd inputs of
// the block (a shift and a mask convert a pair of bf16 in one 32-bit lane), so the activations
// are first copied into the matching order: PrepareActivations. With many activation rows the
// AVX-512 kernels widen a few weight rows at a time into a float32 panel once, in that same
// order, and reuse it for every row.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_isa.h"
#include "ops/weight.h"

namespace gizllm {

// One weight's share of a matmul.
struct MatmulSlice {
  const Weight* w = nullptr;  // [n, cols], plain format
  const float* x = nullptr;   // [rows, x_stride] activations as PrepareActivations wrote them
  int64_t x_stride = 0;       // floats per activation row (cols rounded up to the block)
  int64_t rows = 0;
  float* out = nullptr;         // [rows, n]
  const float* bias = nullptr;  // [n] or null
};

// Computes out[:, n0:n1] of a slice.
using MatmulSliceFn = void (*)(const MatmulSlice& s, int64_t n0, int64_t n1);

struct MatmulKernels {
  int block = 1;      // inputs per block; activation rows are padded to a multiple
  int tile_rows = 1;  // weight rows per tile (NW): slices split at multiples of it
  // Activation rows hold bf16 values, two per float of the stride (AVX-512 BF16 kernels).
  bool bf16_activations = false;
  // Copies x [rows, cols] into dst [rows, stride] in the order the kernels for `format` read,
  // zero-padded; stride = cols rounded up to `block`. With prepare_rows > 1 the rows are laid out
  // in tiles of that many (x starts a tile; the last tile's missing rows are zeros), and dst has
  // room for whole tiles.
  void (*prepare)(Format format, const float* x, int64_t rows, int64_t cols, float* dst) = nullptr;
  int prepare_rows = 1;
  MatmulSliceFn slice[3] = {};  // by Format: kF32, kF16, kBf16
};

const MatmulKernels& ScalarMatmulKernels();
const MatmulKernels& Avx2MatmulKernels();
const MatmulKernels& Avx512MatmulKernels();
// bf16 weights only, activations rounded to bf16, vdpbf16ps products (CPUs with avx512_bf16).
const MatmulKernels& Avx512Bf16MatmulKernels();
// The same over weights packed once by PackBf16Weight (any number of rows).
const MatmulKernels& Avx512Bf16PackedMatmulKernels();
// Weights packed by PackBf16Weight with float32 activations: each panel row widened to float32
// (exact float32 products and sums; CPUs with avx512_bf16, where the packing is done).
const MatmulKernels& Avx512PackedMatmulKernels();
// The packed layout: blocks of 32 weight rows (the last zero-padded), each [cols' / 2][32]
// 32-bit lanes holding inputs (2p, 2p + 1) of one row, cols' = cols rounded up to 32 (zeros).
int64_t PackedBf16Bytes(int64_t rows, int64_t cols);
void PackBf16Weight(const uint16_t* w, int64_t rows, int64_t cols, void* out);
const MatmulKernels& MatmulKernelsFor(CpuIsa isa);

inline int64_t PaddedCols(int64_t cols, int block) { return (cols + block - 1) / block * block; }

// The AVX-512 float32 panel product, for other weight formats that fill a panel themselves (the
// quantized kernels): rows [m0, m1) of out[:, n:n + valid_n] (+)= panel [kAvx512PanelRows, len]
// (weight rows n.. over inputs [k0, k0 + len), in the order s.x holds its inputs) times s.x; the
// first panel of a row (k0 = 0) writes with the bias, later ones add. len: a multiple of 16.
inline constexpr int kAvx512PanelRows = 4;
void Avx512PanelRows(const MatmulSlice& s, const float* panel, int64_t k0, int64_t len, int64_t m0,
                     int64_t m1, int64_t n, int valid_n);

// The AVX-512 BF16 panel product, for other weight formats that decode their rows themselves
// (the quantized kernels, with bf16 activations): Avx512Bf16Tiles lays out s.x (rows rounded to
// bf16 as Avx512Bf16MatmulKernels' prepare writes them) in tiles once per slice; then
// Avx512Bf16RowsPanel adds out[:, n:n + valid_n] (+)= those tiles times 32 weight rows n.. over
// inputs [k0, k0 + len), given as bf16 rows w32 [32, len] (row i past valid_n is ignored); the
// first panel of a row (k0 = 0) writes with the bias, later ones add. len: a multiple of 32, at
// most kAvx512Bf16PanelInputs.
inline constexpr int64_t kAvx512Bf16PanelInputs = 384;
void Avx512Bf16Tiles(const MatmulSlice& s, std::vector<uint32_t>* tiles);
void Avx512Bf16RowsPanel(const MatmulSlice& s, const uint32_t* tiles, const uint16_t* w32,
                         int64_t k0, int64_t len, int64_t n, int valid_n);

// Floats per prepared activation row.
inline int64_t ActivationStride(const MatmulKernels& k, int64_t cols) {
  int64_t padded = PaddedCols(cols, k.block);
  return k.bf16_activations ? padded / 2 : padded;
}

}  // namespace gizllm
