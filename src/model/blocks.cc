#include "model/blocks.h"

namespace gizllm {

StepBuilder::StepBuilder(Backend& backend, float* x, float* h, float* o, int64_t rows,
                         int64_t dim, float eps)
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
                            std::span<const float* const> rope_tables) {
  const LayerSpec& layer_spec = arch.layer[layer];
  spec_ = layer_spec.attention;
  if (spec_.rope < 0 || spec_.rope >= static_cast<int>(rope_tables.size()))
    return Internal("layer " + std::to_string(layer) + ": no rope table " +
                    std::to_string(spec_.rope));
  inv_freq_ = rope_tables[spec_.rope];
  rotary_dims_ = arch.ropes[spec_.rope].rotary_dims;
  GZ_ASSIGN_OR_RETURN(norm_, w.Vector(TensorRole::kAttnNorm, layer));
  if (layer_spec.post_norms) {
    GZ_ASSIGN_OR_RETURN(post_norm_, w.Vector(TensorRole::kAttnPostNorm, layer));
  }
  GZ_ASSIGN_OR_RETURN(q_, w.Matrix(TensorRole::kQ, layer));
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
  RopeKvParams rope_kv;
  rope_kv.q = {in.q,      n,        spec_.heads, spec_.head_dim, rotary_dims_,
               in.rotary, inv_freq_, q_norm_,    step.eps()};
  rope_kv.k = rope_kv.q;
  rope_kv.k.x = in.k;
  rope_kv.k.heads = spec_.kv_heads;
  rope_kv.k.norm = k_norm_;
  rope_kv.kv = {kv,           in.table, in.k, in.v, in.slots, in.positions,
                n,            spec_.kv_heads, spec_.head_dim};
  be.RopeKv(rope_kv);
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
  MatmulParams out;
  out.x = in.attn;
  out.rows = n;
  out.w[0] = &o_;
  out.bias[0] = o_bias_;
  step.AddToStream(out, post_norm_);
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
  step.backend().MoeFeedForward(p);
  step.AddOutput(post_norm_);
}

}  // namespace gizllm
