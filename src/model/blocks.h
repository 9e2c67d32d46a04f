// The forward pass in pieces: a StepBuilder that owns the residual stream and the fusion rules,
// and blocks (attention, dense feed-forward) that load their own weights by role and issue ops
// through it. A block knows its spec and its weights, not the backend's fusions; a family's
// recipe (model/families/) chooses the blocks and their specs, not the ops.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "model/arch.h"
#include "model/weights.h"
#include "ops/backend.h"

namespace gizllm {

// What every block of a step reads, in device memory: the rows' slots and positions, their page
// table, and the blocks' scratch buffers (sized for the widest layer).
struct StepInputs {
  int64_t rows = 0;
  const int32_t* slots = nullptr;      // [rows]
  const int32_t* positions = nullptr;  // [rows] KV position
  const int32_t* rotary = nullptr;     // [rows] rotary position (M-RoPE: the time position)
  const int32_t* rotary_h = nullptr;   // [rows] M-RoPE height position, or null (text rows)
  const int32_t* rotary_w = nullptr;   // [rows] M-RoPE width position, or null
  const int32_t* iota = nullptr;       // [rows] 0, 1, 2, ...: row copies by GatherRows
  PageTable table;
  float* q = nullptr;          // [rows, max q dim]
  float* k = nullptr;          // [rows, max kv dim]
  float* v = nullptr;          // [rows, max kv dim]
  float* attn = nullptr;       // [rows, max q dim]
  float* gate = nullptr;       // [rows, max ffn]
  float* up = nullptr;         // [rows, max ffn]
  float* attn_gate = nullptr;  // [rows, max q dim]: attention's output gate
  float* mix = nullptr;        // [rows, max conv dim]: a recurrent layer's q, k, v
  float* z = nullptr;          // [rows, max value dim]
  float* b = nullptr;          // [rows, max v_heads]
  float* a = nullptr;          // [rows, max v_heads]
};

// The residual stream x of a step and how blocks read and add to it.
//
// Where the backend fuses the ends of its matmuls (FusesMatmul), a norm runs inside the matmul
// that reads it and a block's last projection adds into x, so x is current. Otherwise, and after
// a block whose output is normalized before it joins x (post-norms), the output waits in `o` and
// joins x inside the next norm (the RmsNorm op's fused residual add): x lags one addition behind
// until Current() is asked for.
class StepBuilder {
 public:
  StepBuilder(Backend& backend, float* x, float* h, float* o, int64_t rows, int64_t dim, float eps);

  Backend& backend() { return backend_; }
  int64_t rows() const { return rows_; }
  float eps() const { return eps_; }

  // Sets m's input to norm(x) with this weight: x with the norm fused, or h after an RmsNorm op.
  void Normed(const float* norm, MatmulParams* m);
  // Issues m (x, rows, weights and bias set; one output) as a block's last projection: x += its
  // output, or with post_norm x += norm(output).
  void AddToStream(MatmulParams m, const float* post_norm);
  // norm(x) in a buffer of its own (an RmsNorm op, never fused), for a block whose first op is
  // not a Matmul.
  const float* NormedRows(const float* norm);
  // Where a block whose last op is not a Matmul writes its output, [rows, dim]; AddOutput then
  // adds it to x (with post_norm, norm(output)), in the next norm or in Current().
  float* output() { return o_; }
  void AddOutput(const float* post_norm);
  // x with every addition made, for reading the residual stream (hidden states, the head).
  float* Current();
  // Whether x lags (the head then normalizes through Normed instead of gathering rows of x).
  bool pending() const { return pending_; }

 private:
  Backend& backend_;
  float* x_;
  float* h_;
  float* o_;
  int64_t rows_;
  int64_t dim_;
  float eps_;
  bool fuse_;
  bool pending_ = false;
};

// Causal self-attention with its pre-norm (and post-norm): q, k, v projections (biases), per-head
// q and k norms, the rotation, the KV write, attention over the layer's pages (window,
// soft-capping), the output gate (sigmoid of q_proj's gate half), the output projection added
// into the residual stream.
class AttentionBlock {
 public:
  // rope_tables: the device inv_freq table of each of Arch::ropes; mrope_tables: for each rope
  // with an mrope_section, its three Rope::MropeInvFreq tables (time, height, width), else
  // null.
  Status Load(WeightLoader& w, const Arch& arch, int layer,
              std::span<const float* const> rope_tables,
              std::span<const std::array<const float*, 3>> mrope_tables);
  void Issue(StepBuilder& step, const StepInputs& in) const;

  const AttentionSpec& spec() const { return spec_; }
  KvLayer kv;  // this layer's part of the page pool, set when the pool is allocated

 private:
  AttentionSpec spec_;
  int rotary_dims_ = 0;
  const float* inv_freq_ = nullptr;
  // M-RoPE: each axis' frequencies (the others zero), or null. Rows with height and width
  // positions rotate by the three in turn.
  std::array<const float*, 3> mrope_ = {};
  const float* norm_ = nullptr;       // [dim]
  const float* post_norm_ = nullptr;  // [dim] or null
  const float* q_norm_ = nullptr;     // [head_dim] or null
  const float* k_norm_ = nullptr;     // [head_dim] or null
  const float* q_bias_ = nullptr;
  const float* k_bias_ = nullptr;
  const float* v_bias_ = nullptr;
  const float* o_bias_ = nullptr;
  Weight q_, k_, v_, o_;
  Weight gate_;  // output_gate: q_proj's gate rows
};

// A recurrent layer (RecurrentSpec) with its pre-norm: projections, the causal convolution over
// q, k, v with its per-slot state, L2 norms of q and k, the gated delta rule over the per-slot
// state, the gated norm with z, out_proj added into the residual stream.
class RecurrentBlock {
 public:
  Status Load(WeightLoader& w, const Arch& arch, int layer);
  void Issue(StepBuilder& step, const StepInputs& in) const;
  // The state updates of the step's rows [first, first + rows) (one slot's, in order) again,
  // from their inputs the step kept (row_mix, row_b, row_a): the slot's states move on from
  // what they hold as the step moved them. Outputs go to scratch (in.mix, in.attn).
  void Replay(Backend& be, const StepInputs& in, int64_t first, int64_t rows) const;
  // The same for `rows` rows of the step picked by `index` (device memory, each slot's rows in
  // order), with their slots and positions: many slots' kept rows in one pass. Also overwrites
  // the scratch in.b and in.a.
  void ReplayRows(Backend& be, const StepInputs& in, const int32_t* index, const int32_t* slots,
                  const int32_t* positions, int64_t rows) const;

  const RecurrentSpec& spec() const { return spec_; }
  // This layer's states, set when they are allocated.
  float* conv_states = nullptr;   // [slots, kernel - 1, conv dim]
  float* delta_states = nullptr;  // [slots, v_heads, k_dim, v_dim]
  // Each row's inputs to the state update that the last step read, kept for Replay where the
  // engine reads drafts (Runner::ReserveDrafts); null: not kept.
  float* row_mix = nullptr;  // [rows, conv dim]: the convolution's input (q, k, v)
  float* row_b = nullptr;    // [rows, v_heads]
  float* row_a = nullptr;    // [rows, v_heads]

 private:
  // The convolution (its state), q and k normalized, and the delta rule (its state) over
  // `rows` rows of `mix` (the convolution's input, overwritten) with their b and a; the rule's
  // output to `out` [rows, v_heads, v_dim].
  void UpdateStates(Backend& be, float* mix, const float* b, const float* a, const int32_t* slots,
                    const int32_t* positions, int64_t rows, float* out) const;

  RecurrentSpec spec_;
  float eps_ = 1e-6f;
  const float* norm_ = nullptr;      // [dim]
  const float* conv_ = nullptr;      // [conv dim, kernel]
  const float* a_log_ = nullptr;     // [v_heads]
  const float* dt_bias_ = nullptr;   // [v_heads]
  const float* out_norm_ = nullptr;  // [v_dim]
  Weight qkv_, z_, b_, a_, out_;
};

// Dense gated feed-forward with its pre-norm (and post-norm): down(act(gate(x)) * up(x)).
class FeedForwardBlock {
 public:
  Status Load(WeightLoader& w, const Arch& arch, int layer);
  void Issue(StepBuilder& step, const StepInputs& in) const;

 private:
  FeedForwardSpec spec_;
  const float* norm_ = nullptr;
  const float* post_norm_ = nullptr;
  const float* gate_bias_ = nullptr;
  const float* up_bias_ = nullptr;
  const float* down_bias_ = nullptr;
  Weight gate_, up_, down_;
};

// Mixture-of-experts feed-forward with its pre-norm (and post-norm): one MoeFeedForward op over
// norm(x) (routing and the experts), its output added into the residual stream.
class MoeFeedForwardBlock {
 public:
  Status Load(WeightLoader& w, const Arch& arch, int layer);
  void Issue(StepBuilder& step, const StepInputs& in) const;

  // Where the loader kept the experts on the host (WeightLoader::KeepExpertsOnHost), one of:
  // PlaceExperts places them on the backend (every expert resident), or UseExpertCache leaves
  // them for the backend's expert cache (Backend::ReserveExpertCache), which MoeFeedForward then
  // reads them through.
  Status PlaceExperts(WeightLoader& w);
  void UseExpertCache() { cached_ = true; }
  const MoeSpec& spec() const { return spec_; }
  // Expert e's weights (host weights before PlaceExperts).
  const Weight& gate(int e) const { return gate_[e]; }
  const Weight& up(int e) const { return up_[e]; }
  const Weight& down(int e) const { return down_[e]; }

 private:
  MoeSpec spec_;
  bool cached_ = false;
  int64_t dim_ = 0;
  const float* norm_ = nullptr;
  const float* post_norm_ = nullptr;
  Weight router_;
  Weight shared_gate_, shared_up_, shared_down_, shared_scale_;
  std::vector<Weight> gate_, up_, down_;  // [experts] each
};

}  // namespace gizllm
