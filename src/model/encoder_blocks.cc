#include "model/encoder_blocks.h"

#include <cmath>

namespace gizllm {
namespace {

using T = EncoderTensor;

// A linear with its bias: [outputs, inputs] and [outputs].
Status LoadLinear(WeightLoader& loader, const EncoderArch& arch, T weight, T bias, int layer,
                  int64_t outputs, int64_t inputs, Weight* w, const float** b) {
  GZ_ASSIGN_OR_RETURN(*w,
                      loader.NamedMatrix(EncoderTensorName(arch, weight, layer), outputs, inputs));
  GZ_ASSIGN_OR_RETURN(*b, loader.NamedVector(EncoderTensorName(arch, bias, layer), outputs));
  return Status::Ok();
}

Status LoadNorm(WeightLoader& loader, const EncoderArch& arch, T weight, T bias, int layer,
                const float** w, const float** b) {
  GZ_ASSIGN_OR_RETURN(*w, loader.NamedVector(EncoderTensorName(arch, weight, layer), arch.dim));
  GZ_ASSIGN_OR_RETURN(*b, loader.NamedVector(EncoderTensorName(arch, bias, layer), arch.dim));
  return Status::Ok();
}

void Linear(Backend& be, const float* x, int64_t rows, const Weight& w, const float* bias,
            float* out) {
  MatmulParams m;
  m.x = x;
  m.rows = rows;
  m.w[0] = &w;
  m.bias[0] = bias;
  m.out[0] = out;
  be.Matmul(m);
}

}  // namespace

Status EncoderEmbeddings::Load(WeightLoader& loader, const EncoderArch& arch) {
  arch_ = &arch;
  GZ_ASSIGN_OR_RETURN(
      word_, loader.NamedMatrix(EncoderTensorName(arch, T::kWordEmbed, -1), arch.vocab, arch.dim));
  GZ_ASSIGN_OR_RETURN(position_, loader.NamedMatrix(EncoderTensorName(arch, T::kPositionEmbed, -1),
                                                    arch.positions, arch.dim));
  GZ_ASSIGN_OR_RETURN(type_, loader.NamedMatrix(EncoderTensorName(arch, T::kTypeEmbed, -1),
                                                arch.type_vocab, arch.dim));
  return LoadNorm(loader, arch, T::kEmbedNormWeight, T::kEmbedNormBias, -1, &norm_weight_,
                  &norm_bias_);
}

void EncoderEmbeddings::Run(Backend& be, const EncoderBuffers& b) const {
  const int64_t n = b.rows * arch_->dim;
  be.Embed({b.x, &word_, b.tokens, b.rows});
  be.Embed({b.t, &position_, b.positions, b.rows});
  be.Add({b.x, b.t, n});
  be.Embed({b.t, &type_, b.types, b.rows});
  be.Add({b.x, b.t, n});
  be.LayerNorm({b.x, b.x, nullptr, norm_weight_, norm_bias_, b.rows, arch_->dim,
                static_cast<float>(arch_->norm_eps)});
}

Status EncoderAttentionBlock::Load(WeightLoader& loader, const EncoderArch& arch, int layer) {
  arch_ = &arch;
  const int64_t d = arch.dim;
  GZ_RETURN_IF_ERROR(LoadLinear(loader, arch, T::kQ, T::kQBias, layer, d, d, &q_, &q_bias_));
  GZ_RETURN_IF_ERROR(LoadLinear(loader, arch, T::kK, T::kKBias, layer, d, d, &k_, &k_bias_));
  GZ_RETURN_IF_ERROR(LoadLinear(loader, arch, T::kV, T::kVBias, layer, d, d, &v_, &v_bias_));
  GZ_RETURN_IF_ERROR(LoadLinear(loader, arch, T::kO, T::kOBias, layer, d, d, &o_, &o_bias_));
  return LoadNorm(loader, arch, T::kAttnNormWeight, T::kAttnNormBias, layer, &norm_weight_,
                  &norm_bias_);
}

void EncoderAttentionBlock::Run(Backend& be, const EncoderBuffers& b) const {
  MatmulParams qkv;
  qkv.x = b.x;
  qkv.rows = b.rows;
  qkv.outputs = 3;
  const Weight* w[] = {&q_, &k_, &v_};
  const float* bias[] = {q_bias_, k_bias_, v_bias_};
  float* out[] = {b.q, b.k, b.v};
  for (int i = 0; i < 3; ++i) {
    qkv.w[i] = w[i];
    qkv.bias[i] = bias[i];
    qkv.out[i] = out[i];
  }
  be.Matmul(qkv);
  be.EncoderAttention({b.a, b.q, b.k, b.v, b.starts, b.rows, b.sequences, arch_->heads,
                       arch_->head_dim, 1.0f / std::sqrt(static_cast<float>(arch_->head_dim))});
  Linear(be, b.a, b.rows, o_, o_bias_, b.t);
  be.LayerNorm({b.x, b.t, b.x, norm_weight_, norm_bias_, b.rows, arch_->dim,
                static_cast<float>(arch_->norm_eps)});
}

Status EncoderFeedForwardBlock::Load(WeightLoader& loader, const EncoderArch& arch, int layer) {
  arch_ = &arch;
  GZ_RETURN_IF_ERROR(
      LoadLinear(loader, arch, T::kUp, T::kUpBias, layer, arch.ffn, arch.dim, &up_, &up_bias_));
  GZ_RETURN_IF_ERROR(LoadLinear(loader, arch, T::kDown, T::kDownBias, layer, arch.dim, arch.ffn,
                                &down_, &down_bias_));
  return LoadNorm(loader, arch, T::kFfnNormWeight, T::kFfnNormBias, layer, &norm_weight_,
                  &norm_bias_);
}

void EncoderFeedForwardBlock::Run(Backend& be, const EncoderBuffers& b) const {
  Linear(be, b.x, b.rows, up_, up_bias_, b.f);
  be.Gelu({b.f, b.rows * arch_->ffn});
  Linear(be, b.f, b.rows, down_, down_bias_, b.t);
  be.LayerNorm({b.x, b.t, b.x, norm_weight_, norm_bias_, b.rows, arch_->dim,
                static_cast<float>(arch_->norm_eps)});
}

Status ClassifierHead::Load(WeightLoader& loader, const EncoderArch& arch) {
  arch_ = &arch;
  GZ_RETURN_IF_ERROR(LoadLinear(loader, arch, T::kHeadDense, T::kHeadDenseBias, -1, arch.dim,
                                arch.dim, &dense_, &dense_bias_));
  return LoadLinear(loader, arch, T::kHeadOut, T::kHeadOutBias, -1, arch.labels, arch.dim, &out_,
                    &out_bias_);
}

void ClassifierHead::Run(Backend& be, const float* first, float* hidden, float* logits,
                         int sequences) const {
  Linear(be, first, sequences, dense_, dense_bias_, hidden);
  be.Softcap({hidden, sequences * arch_->dim, /*cap=*/1.0f});  // tanh
  Linear(be, hidden, sequences, out_, out_bias_, logits);
}

}  // namespace gizllm
