// GPTQ: quantization of a linear that keeps its outputs, not its weights, close to the original.
//
// For inputs X [n, cols] the outputs' squared error is ||X W^T - X Q^T||^2 = tr(D H D^T) with
// D = W - Q and H = X^T X, the inputs' Gram matrix. GPTQ (Frantar et al., 2022) quantizes the
// columns of W one after the other; after column j it moves the columns after j so that they
// make up, through the correlations in H, for the error of column j: with U the upper triangular
// factor of H^-1 = U^T U, row r loses err * U[j, k] at every column k > j, where
// err = (w[r, j] - q[r, j]) / U[j, j]. Where H is a multiple of the identity (inputs with no
// correlation) nothing moves and GPTQ is plain rounding.
//
// The groups keep the layout of quant/layout.h: when the pass reaches a group's first column,
// the group's scale (and zero) are chosen by the same search as QuantizeGroup over the group's
// current (already compensated) weights, and each column of the group is then rounded to the
// nearest code of that fixed scale. Columns go in their stored order (no act-order: it would need
// a scale per group chosen before the pass). With the rotation on, W and H are first taken into
// the rotated basis (W R and R^T H R), where the linear is stored.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "core/thread_pool.h"
#include "quant/quantize.h"

namespace gizllm::quant {

// l [n, n] <- the lower triangular factor of a [n, n] (symmetric positive definite, row-major):
// a = l l^T; the upper triangle of l is zero. False when a pivot is not positive.
bool Cholesky(const double* a, int64_t n, double* l, ThreadPool* pool = nullptr);

// u [n, n] <- the upper triangular factor of a^-1 = u^T u, for a [n, n] symmetric positive
// definite, without forming a^-1: the lower factor m of the reversed matrix (a read from its
// last row and column) gives a = k k^T with k upper triangular, and u = k^-1. False when a is
// not positive definite.
bool InverseCholesky(const double* a, int64_t n, double* u, ThreadPool* pool = nullptr);

// gram [cols, cols] <- R^T gram R, the Gram matrix of the rotated inputs x R (quant/hadamard.h).
void RotateGram(float* gram, int64_t cols, uint64_t seed);

struct GptqOptions {
  // Added to H's diagonal as a fraction of its mean (0.01 as in the paper), so that inputs seen
  // rarely or never do not make H singular; multiplied by 10 while H stays singular.
  double damp = 0.01;
  Status Check() const;  // damp in [0, 1]
};

// Quantizes W [rows, cols] (float32, row-major; cols a multiple of 128) in the format, zeros and
// rotation of `options`, minimizing the error of its outputs for inputs whose Gram matrix is
// `gram` [cols, cols] = X^T X, with X the inputs as the model computes them (before any
// rotation: the rotation is applied to both here). Runs on `pool` when given.
Expected<QuantizedLinear> GptqQuantizeLinear(const float* w, int64_t rows, int64_t cols,
                                             const float* gram, const QuantizeOptions& options,
                                             const GptqOptions& gptq, ThreadPool* pool = nullptr);

}  // namespace gizllm::quant
