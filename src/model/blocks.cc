#include "model/blocks.h"

#include <cmath>

#include "core/check.h"

namespace gizllm {

StepBuilder::StepBuilder(Backend& backend, float* x, float* h, float* o, int64_t rows, int64_t dim,
                         float eps)
    : backend_(backend),
      x_(x),
      h_(h),
      o_(o),
      rows_(rows),
      dim_(dim),
      eps_(eps),
      fuse_(backend.FusesMatmul()) {}

void StepBuilder::Normed(const float* norm, MatmulParams* m) {
  if (fuse_ && !pending_) {
    m->x = x_;
    m->norm = norm;
    m->norm_eps = eps_;
    return;
  }
  backend_.RmsNorm({h_, pending_ ? o_ : x_, pending_ ? x_ : nullptr, norm, rows_, dim_, eps_});
  pending_ = false;
  m->x = h_;
}

void StepBuilder::AddToStream(MatmulParams m, const float* post_norm) {
  if (fuse_ && !post_norm) {
    m.out[0] = x_;
    m.accumulate = true;
    backend_.Matmul(m);
    return;
  }
  m.out[0] = o_;
  backend_.Matmul(m);
  if (post_norm) backend_.RmsNorm({o_, o_, nullptr, post_norm, rows_, dim_, eps_});
  pending_ = true;
}

const float* StepBuilder::NormedRows(const float* norm) {
  backend_.RmsNorm({h_, pending_ ? o_ : x_, pending_ ? x_ : nullptr, norm, rows_, dim_, eps_});
  pending_ = false;
  return h_;
}

void StepBuilder::AddOutput(const float* post_norm) {
  if (post_norm) backend_.RmsNorm({o_, o_, nullptr, post_norm, rows_, dim_, eps_});
  pending_ = true;
}

float* StepBuilder::Current() {
  if (pending_) {
    backend_.Add({x_, o_, rows_ * dim_});
    pending_ = false;
  }
  return x_;
}

Status AttentionBlock::Load(WeightLoader& w, const Arch& arch, int layer,
                            std::span<const float* const> rope_tables,
                            std::span<const std::array<const float*, 3>> mrope_tables) {
  const LayerSpec& layer_spec = arch.layer[layer];
  spec_ = layer_spec.attention;
  if (spec_.rope < 0 || spec_.rope >= static_cast<int>(rope_tables.size()))
    return Internal("layer " + std::to_string(layer) + ": no rope table " +
                    std::to_string(spec_.rope));
  inv_freq_ = rope_tables[spec_.rope];
  if (spec_.rope < static_cast<int>(mrope_tables.size())) mrope_ = mrope_tables[spec_.rope];
  rotary_dims_ = arch.ropes[spec_.rope].rotary_dims;
  GZ_ASSIGN_OR_RETURN(norm_, w.Vector(TensorRole::kAttnNorm, layer));
  if (layer_spec.post_norms) {
    GZ_ASSIGN_OR_RETURN(post_norm_, w.Vector(TensorRole::kAttnPostNorm, layer));
  }
  if (spec_.output_gate) {
    // q_proj holds each head's query rows, then its gate rows.
    std::vector<WeightLoader::Rows> query, gate;
    for (int h = 0; h < spec_.heads; ++h) {
      const int64_t first = 2 * static_cast<int64_t>(h) * spec_.head_dim;
      query.push_back({first, spec_.head_dim});
      gate.push_back({first + spec_.head_dim, spec_.head_dim});
    }
    GZ_ASSIGN_OR_RETURN(q_, w.MatrixRows(TensorRole::kQ, layer, query, "query"));
    GZ_ASSIGN_OR_RETURN(gate_, w.MatrixRows(TensorRole::kQ, layer, gate, "gate"));
  } else {
    GZ_ASSIGN_OR_RETURN(q_, w.Matrix(TensorRole::kQ, layer));
  }
  GZ_ASSIGN_OR_RETURN(k_, w.Matrix(TensorRole::kK, layer));
  GZ_ASSIGN_OR_RETURN(v_, w.Matrix(TensorRole::kV, layer));
  GZ_ASSIGN_OR_RETURN(o_, w.Matrix(TensorRole::kO, layer));
  if (spec_.qk_norm) {
    GZ_ASSIGN_OR_RETURN(q_norm_, w.Vector(TensorRole::kQNorm, layer));
    GZ_ASSIGN_OR_RETURN(k_norm_, w.Vector(TensorRole::kKNorm, layer));
  }
  if (spec_.qkv_bias) {
    GZ_ASSIGN_OR_RETURN(q_bias_, w.Vector(TensorRole::kQBias, layer));
    GZ_ASSIGN_OR_RETURN(k_bias_, w.Vector(TensorRole::kKBias, layer));
    GZ_ASSIGN_OR_RETURN(v_bias_, w.Vector(TensorRole::kVBias, layer));
  }
  if (spec_.output_bias) {
    GZ_ASSIGN_OR_RETURN(o_bias_, w.Vector(TensorRole::kOBias, layer));
  }
  return Status::Ok();
}

void AttentionBlock::Issue(StepBuilder& step, const StepInputs& in) const {
  Backend& be = step.backend();
  const int64_t n = in.rows;
  MatmulParams qkv;
  step.Normed(norm_, &qkv);
  qkv.rows = n;
  qkv.outputs = 3;
  qkv.w[0] = &q_, qkv.w[1] = &k_, qkv.w[2] = &v_;
  qkv.out[0] = in.q, qkv.out[1] = in.k, qkv.out[2] = in.v;
  qkv.bias[0] = q_bias_, qkv.bias[1] = k_bias_, qkv.bias[2] = v_bias_;
  be.Matmul(qkv);
  if (spec_.output_gate) {
    MatmulParams gate = qkv;  // the same normalized input
    gate.outputs = 1;
    gate.w[0] = &gate_;
    gate.out[0] = in.attn_gate;
    gate.bias[0] = nullptr;
    be.Matmul(gate);
  }
  RopeKvParams rope_kv;
  rope_kv.q = {in.q,      n,         spec_.heads, spec_.head_dim, rotary_dims_,
               in.rotary, inv_freq_, q_norm_,     step.eps()};
  rope_kv.k = rope_kv.q;
  rope_kv.k.x = in.k;
  rope_kv.k.heads = spec_.kv_heads;
  rope_kv.k.norm = k_norm_;
  rope_kv.kv = {kv,           in.table, in.k,           in.v,          in.slots,
                in.positions, n,        spec_.kv_heads, spec_.head_dim};
  if (in.rotary_h && mrope_[0]) {
    // M-RoPE: the time, height and width frequencies rotate by their own positions; each
    // table leaves the other axes' pairs as they are (angle 0), the q/k norms go first.
    for (RopeParams r : {rope_kv.q, rope_kv.k}) {
      const int32_t* positions[] = {in.rotary, in.rotary_h, in.rotary_w};
      for (int axis = 0; axis < 3; ++axis) {
        r.positions = positions[axis];
        r.inv_freq = mrope_[axis];
        be.Rope(r);
        r.norm = nullptr;
      }
    }
    be.KvWrite(rope_kv.kv);
  } else {
    be.RopeKv(rope_kv);
  }
  AttentionParams att;
  att.out = in.attn;
  att.q = in.q;
  att.cache = kv;
  att.table = in.table;
  att.slots = in.slots;
  att.positions = in.positions;
  att.rows = n;
  att.heads = spec_.heads;
  att.kv_heads = spec_.kv_heads;
  att.head_dim = spec_.head_dim;
  att.scale = spec_.scale;
  att.window = spec_.window;
  att.softcap = spec_.softcap;
  be.Attention(att);
  if (spec_.output_gate) {
    be.Glu({in.attn, in.attn_gate, in.attn, n * spec_.QDim(), Activation::kSigmoid});
  }
  MatmulParams out;
  out.x = in.attn;
  out.rows = n;
  out.w[0] = &o_;
  out.bias[0] = o_bias_;
  step.AddToStream(out, post_norm_);
}

Status RecurrentBlock::Load(WeightLoader& w, const Arch& arch, int layer) {
  spec_ = arch.layer[layer].recurrent;
  eps_ = static_cast<float>(arch.norm_eps);
  GZ_ASSIGN_OR_RETURN(norm_, w.Vector(TensorRole::kAttnNorm, layer));
  if (spec_.fused_projections) {
    // Qwen3-Next: in_proj_qkvz holds, for each key head g, its q and k rows, then the v rows
    // and the z rows of its value heads; in_proj_ba the b rows, then the a rows, of those value
    // heads. Gathered into q of every head, k of every head, v of every head (the
    // convolution's channel order), and z, b, a.
    const int64_t kd = spec_.k_dim, vd = spec_.v_dim;
    const int64_t per = spec_.v_heads / spec_.k_heads;  // value heads of a key head
    const int64_t group = 2 * kd + 2 * per * vd;
    std::vector<WeightLoader::Rows> qkv, z, b, a;
    for (int64_t g = 0; g < spec_.k_heads; ++g) qkv.push_back({g * group, kd});
    for (int64_t g = 0; g < spec_.k_heads; ++g) qkv.push_back({g * group + kd, kd});
    for (int64_t g = 0; g < spec_.k_heads; ++g) qkv.push_back({g * group + 2 * kd, per * vd});
    for (int64_t g = 0; g < spec_.k_heads; ++g) {
      z.push_back({g * group + 2 * kd + per * vd, per * vd});
      b.push_back({g * 2 * per, per});
      a.push_back({g * 2 * per + per, per});
    }
    GZ_ASSIGN_OR_RETURN(qkv_, w.MatrixRows(TensorRole::kRecurrentQkvz, layer, qkv, "qkv"));
    GZ_ASSIGN_OR_RETURN(z_, w.MatrixRows(TensorRole::kRecurrentQkvz, layer, z, "z"));
    GZ_ASSIGN_OR_RETURN(b_, w.MatrixRows(TensorRole::kRecurrentBa, layer, b, "b"));
    GZ_ASSIGN_OR_RETURN(a_, w.MatrixRows(TensorRole::kRecurrentBa, layer, a, "a"));
  } else {
    GZ_ASSIGN_OR_RETURN(qkv_, w.Matrix(TensorRole::kRecurrentQkv, layer));
    GZ_ASSIGN_OR_RETURN(z_, w.Matrix(TensorRole::kRecurrentZ, layer));
    GZ_ASSIGN_OR_RETURN(b_, w.Matrix(TensorRole::kRecurrentB, layer));
    GZ_ASSIGN_OR_RETURN(a_, w.Matrix(TensorRole::kRecurrentA, layer));
  }
  GZ_ASSIGN_OR_RETURN(conv_, w.Floats(TensorRole::kRecurrentConv, layer));
  GZ_ASSIGN_OR_RETURN(a_log_, w.Floats(TensorRole::kRecurrentALog, layer));
  GZ_ASSIGN_OR_RETURN(dt_bias_, w.Floats(TensorRole::kRecurrentDtBias, layer));
  GZ_ASSIGN_OR_RETURN(out_norm_, w.Floats(TensorRole::kRecurrentNorm, layer));
  GZ_ASSIGN_OR_RETURN(out_, w.Matrix(TensorRole::kRecurrentOut, layer));
  return Status::Ok();
}

void RecurrentBlock::Issue(StepBuilder& step, const StepInputs& in) const {
  Backend& be = step.backend();
  const int64_t n = in.rows;
  const int64_t conv_dim = spec_.ConvDim();
  // Where the engine reads drafts, b and a are written where Replay finds them, and the
  // convolution's input (overwritten by the convolution) is copied there first.
  float* b = row_b ? row_b : in.b;
  float* a_in = row_a ? row_a : in.a;
  MatmulParams proj;
  step.Normed(norm_, &proj);
  proj.rows = n;
  proj.outputs = 3;
  proj.w[0] = &qkv_, proj.w[1] = &z_, proj.w[2] = &b_;
  proj.out[0] = in.mix, proj.out[1] = in.z, proj.out[2] = b;
  be.Matmul(proj);
  MatmulParams a = proj;  // the same normalized input
  a.outputs = 1;
  a.w[0] = &a_;
  a.out[0] = a_in;
  be.Matmul(a);
  if (row_mix) be.GatherRows({row_mix, in.mix, in.iota, n, conv_dim});
  UpdateStates(be, in.mix, b, a_in, in.slots, in.positions, n, in.attn);
  be.GatedRmsNorm({in.attn, in.attn, in.z, out_norm_, n * spec_.v_heads, spec_.v_dim, eps_});
  MatmulParams out;
  out.x = in.attn;
  out.rows = n;
  out.w[0] = &out_;
  step.AddToStream(out, nullptr);
}

void RecurrentBlock::Replay(Backend& be, const StepInputs& in, int64_t first, int64_t rows) const {
  DCHECK(row_mix != nullptr && rows > 0);
  const int64_t conv_dim = spec_.ConvDim();
  be.GatherRows({in.mix, row_mix + first * conv_dim, in.iota, rows, conv_dim});
  UpdateStates(be, in.mix, row_b + first * spec_.v_heads, row_a + first * spec_.v_heads,
               in.slots + first, in.positions + first, rows, in.attn);
}

void RecurrentBlock::ReplayRows(Backend& be, const StepInputs& in, const int32_t* index,
                                const int32_t* slots, const int32_t* positions,
                                int64_t rows) const {
  DCHECK(row_mix != nullptr && rows > 0);
  be.GatherRows({in.mix, row_mix, index, rows, spec_.ConvDim()});
  be.GatherRows({in.b, row_b, index, rows, spec_.v_heads});
  be.GatherRows({in.a, row_a, index, rows, spec_.v_heads});
  UpdateStates(be, in.mix, in.b, in.a, slots, positions, rows, in.attn);
}

void RecurrentBlock::UpdateStates(Backend& be, float* mix, const float* b, const float* a,
                                  const int32_t* slots, const int32_t* positions, int64_t rows,
                                  float* out) const {
  const int64_t conv_dim = spec_.ConvDim(), key_dim = spec_.KeyDim();
  be.CausalConv(
      {mix, rows, conv_dim, conv_dim, spec_.kernel, conv_, conv_states, slots, positions});
  be.L2Norm({mix, rows, 2 * spec_.k_heads, spec_.k_dim, conv_dim, 1e-6f});
  GatedDeltaRuleParams rule;
  rule.out = out;
  rule.q = mix;
  rule.k = mix + key_dim;
  rule.qk_stride = conv_dim;
  rule.v = mix + 2 * key_dim;
  rule.v_stride = conv_dim;
  rule.a = a;
  rule.b = b;
  rule.ab_stride = spec_.v_heads;
  rule.a_log = a_log_;
  rule.dt_bias = dt_bias_;
  rule.states = delta_states;
  rule.slots = slots;
  rule.positions = positions;
  rule.rows = rows;
  rule.k_heads = spec_.k_heads;
  rule.v_heads = spec_.v_heads;
  rule.k_dim = spec_.k_dim;
  rule.v_dim = spec_.v_dim;
  rule.scale = 1.0f / std::sqrt(static_cast<float>(spec_.k_dim));
  be.GatedDeltaRule(rule);
}

Status FeedForwardBlock::Load(WeightLoader& w, const Arch& arch, int layer) {
  const LayerSpec& layer_spec = arch.layer[layer];
  spec_ = layer_spec.feed_forward;
  GZ_ASSIGN_OR_RETURN(norm_, w.Vector(TensorRole::kFfnNorm, layer));
  if (layer_spec.post_norms) {
    GZ_ASSIGN_OR_RETURN(post_norm_, w.Vector(TensorRole::kFfnPostNorm, layer));
  }
  GZ_ASSIGN_OR_RETURN(gate_, w.Matrix(TensorRole::kGate, layer));
  GZ_ASSIGN_OR_RETURN(up_, w.Matrix(TensorRole::kUp, layer));
  GZ_ASSIGN_OR_RETURN(down_, w.Matrix(TensorRole::kDown, layer));
  if (spec_.bias) {
    GZ_ASSIGN_OR_RETURN(gate_bias_, w.Vector(TensorRole::kGateBias, layer));
    GZ_ASSIGN_OR_RETURN(up_bias_, w.Vector(TensorRole::kUpBias, layer));
    GZ_ASSIGN_OR_RETURN(down_bias_, w.Vector(TensorRole::kDownBias, layer));
  }
  return Status::Ok();
}

void FeedForwardBlock::Issue(StepBuilder& step, const StepInputs& in) const {
  Backend& be = step.backend();
  const int64_t n = in.rows;
  MatmulParams gate_up;
  step.Normed(norm_, &gate_up);
  gate_up.rows = n;
  gate_up.outputs = 2;
  gate_up.w[0] = &gate_, gate_up.w[1] = &up_;
  gate_up.out[0] = in.gate, gate_up.out[1] = in.up;
  gate_up.bias[0] = gate_bias_, gate_up.bias[1] = up_bias_;
  // The fused end is SwiGLU's; another gate is a Glu op after the matmul.
  gate_up.swiglu = spec_.act == Activation::kSilu && be.FusesSwiGlu();
  be.Matmul(gate_up);
  if (!gate_up.swiglu) be.Glu({in.gate, in.gate, in.up, n * spec_.ffn, spec_.act});
  MatmulParams down;
  down.x = in.gate;
  down.rows = n;
  down.w[0] = &down_;
  down.bias[0] = down_bias_;
  step.AddToStream(down, post_norm_);
}

Status MoeFeedForwardBlock::Load(WeightLoader& w, const Arch& arch, int layer) {
  const LayerSpec& layer_spec = arch.layer[layer];
  spec_ = layer_spec.moe;
  dim_ = arch.dim;
  GZ_ASSIGN_OR_RETURN(norm_, w.Vector(TensorRole::kFfnNorm, layer));
  if (layer_spec.post_norms) {
    GZ_ASSIGN_OR_RETURN(post_norm_, w.Vector(TensorRole::kFfnPostNorm, layer));
  }
  GZ_ASSIGN_OR_RETURN(router_, w.Matrix(TensorRole::kRouter, layer));
  gate_.resize(spec_.experts);
  up_.resize(spec_.experts);
  down_.resize(spec_.experts);
  for (int e = 0; e < spec_.experts; ++e) {
    GZ_ASSIGN_OR_RETURN(gate_[e], w.ExpertMatrix(TensorRole::kExpertGate, layer, e));
    GZ_ASSIGN_OR_RETURN(up_[e], w.ExpertMatrix(TensorRole::kExpertUp, layer, e));
    GZ_ASSIGN_OR_RETURN(down_[e], w.ExpertMatrix(TensorRole::kExpertDown, layer, e));
  }
  if (spec_.shared_ffn > 0) {
    GZ_ASSIGN_OR_RETURN(shared_gate_, w.Matrix(TensorRole::kSharedGate, layer));
    GZ_ASSIGN_OR_RETURN(shared_up_, w.Matrix(TensorRole::kSharedUp, layer));
    GZ_ASSIGN_OR_RETURN(shared_down_, w.Matrix(TensorRole::kSharedDown, layer));
    if (spec_.shared_gate) {
      GZ_ASSIGN_OR_RETURN(shared_scale_, w.Matrix(TensorRole::kSharedExpertGate, layer));
    }
  }
  return Status::Ok();
}

Status MoeFeedForwardBlock::PlaceExperts(WeightLoader& w) {
  for (std::vector<Weight>* experts : {&gate_, &up_, &down_}) {
    for (Weight& e : *experts) {
      GZ_ASSIGN_OR_RETURN(e, w.PlaceExpert(e));
    }
  }
  return Status::Ok();
}

void MoeFeedForwardBlock::Issue(StepBuilder& step, const StepInputs& in) const {
  MoeFeedForwardParams p;
  p.x = step.NormedRows(norm_);
  p.out = step.output();
  p.rows = in.rows;
  p.dim = dim_;
  p.ffn = spec_.ffn;
  p.experts = spec_.experts;
  p.top_k = spec_.experts_per_token;
  p.norm_topk_prob = spec_.norm_topk_prob;
  p.router = &router_;
  p.gate = gate_.data();
  p.up = up_.data();
  p.down = down_.data();
  p.cached = cached_;
  if (spec_.shared_ffn > 0) {
    p.shared_ffn = spec_.shared_ffn;
    p.shared_gate = &shared_gate_;
    p.shared_up = &shared_up_;
    p.shared_down = &shared_down_;
    p.shared_scale = spec_.shared_gate ? &shared_scale_ : nullptr;
  }
  step.backend().MoeFeedForward(p);
  step.AddOutput(post_norm_);
}

}  // namespace gizllm
