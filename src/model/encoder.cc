#include "model/encoder.h"

#include <algorithm>

#include "formats/safetensors.h"
#include "model/encoder_blocks.h"

namespace gizllm {

struct Encoder::Impl {
  Checkpoint checkpoint;
  PlacedWeights placed;
  EncoderEmbeddings embeddings;
  std::vector<EncoderAttentionBlock> attention;
  std::vector<EncoderFeedForwardBlock> feed_forward;
  std::unique_ptr<ClassifierHead> head;
  // Device buffers, grown to the largest batch seen.
  std::vector<std::unique_ptr<Buffer>> storage;
  EncoderBuffers buffers;
  int64_t row_capacity = 0;
  int sequence_capacity = 0;
  std::unique_ptr<Buffer> first_rows, head_hidden, logits;  // the head's [sequences, ...]
  std::unique_ptr<Buffer> pooled, last_rows;  // Pool's [sequences, dim] and [sequences]
  // Host copies of the step's inputs.
  std::vector<int32_t> tokens, positions, types, starts, first, last;
};

Encoder::~Encoder() = default;

const std::vector<WeightSummary>& Encoder::weights() const { return impl_->placed.summary; }

Expected<std::unique_ptr<Encoder>> Encoder::Load(const std::string& dir,
                                                 std::shared_ptr<Backend> backend) {
  GZ_ASSIGN_OR_RETURN(EncoderArch arch, ReadEncoderArch(dir));
  if (!backend->SupportsEncoder()) {
    return Unimplemented(dir + ": an encoder (" + arch.family + "); encoders do not run on " +
                         backend->Describe() + " (they run on the CPU and CUDA backends)");
  }
  if (Status s = backend->CheckEncoderShape(arch.head_dim); !s.ok()) {
    return Unimplemented(dir + "/config.json: " + s.message());
  }
  std::unique_ptr<Encoder> encoder(new Encoder());
  encoder->dir_ = dir;
  encoder->backend_ = std::move(backend);
  encoder->impl_ = std::make_unique<Impl>();
  Impl& impl = *encoder->impl_;
  GZ_ASSIGN_OR_RETURN(impl.checkpoint, Checkpoint::Open(dir));
  // The encoder's tensors sit under the class's base-model prefix (a *ForSequenceClassification
  // or *ForMaskedLM checkpoint) or at the top (a *Model, as sentence-transformers saves it).
  bool found = false;
  std::string tried;
  for (const char* prefix : {"", "bert.", "roberta.", "model."}) {
    arch.prefix = prefix;
    const std::string name = EncoderTensorName(arch, EncoderTensor::kWordEmbed, -1);
    tried += (tried.empty() ? "" : ", ") + name;
    if (impl.checkpoint.Find(name)) {
      found = true;
      break;
    }
  }
  if (!found) return NotFound(dir + ": no word embeddings (tried " + tried + ")");
  encoder->arch_ = arch;
  const EncoderArch& a = encoder->arch_;
  Arch names;  // the loader's role names are not used: encoders load by name
  names.family = a.family;
  WeightLoader loader(impl.checkpoint, names, *encoder->backend_, dir, &impl.placed);
  GZ_RETURN_IF_ERROR(impl.embeddings.Load(loader, a));
  impl.attention.resize(a.layers);
  impl.feed_forward.resize(a.layers);
  for (int l = 0; l < a.layers; ++l) {
    GZ_RETURN_IF_ERROR(impl.attention[l].Load(loader, a, l));
    GZ_RETURN_IF_ERROR(impl.feed_forward[l].Load(loader, a, l));
  }
  if (a.head != EncoderHead::kNone) {
    impl.head = std::make_unique<ClassifierHead>();
    GZ_RETURN_IF_ERROR(impl.head->Load(loader, a));
  }
  return encoder;
}

Status Encoder::Run(std::span<const EncoderInput> batch) {
  Impl& impl = *impl_;
  const EncoderArch& a = arch_;
  if (batch.empty()) return InvalidArgument("an empty batch");
  impl.tokens.clear();
  impl.positions.clear();
  impl.types.clear();
  impl.starts.assign(1, 0);
  for (size_t s = 0; s < batch.size(); ++s) {
    const EncoderInput& in = batch[s];
    const std::string which = "sequence " + std::to_string(s);
    const int64_t n = static_cast<int64_t>(in.tokens.size());
    if (n == 0) return InvalidArgument(which + ": no tokens");
    if (n > a.MaxTokens()) {
      return InvalidArgument(which + ": " + std::to_string(n) + " tokens, more than the " +
                             std::to_string(a.MaxTokens()) + " positions of the model");
    }
    if (!in.types.empty() && in.types.size() != in.tokens.size()) {
      return InvalidArgument(which + ": " + std::to_string(in.types.size()) + " token types for " +
                             std::to_string(n) + " tokens");
    }
    for (int64_t i = 0; i < n; ++i) {
      const int32_t token = in.tokens[i];
      if (token < 0 || token >= a.vocab) {
        return InvalidArgument(which + ": token " + std::to_string(token) +
                               " is outside the vocabulary of " + std::to_string(a.vocab));
      }
      const int32_t type = a.token_types && !in.types.empty() ? in.types[i] : 0;
      if (type < 0 || type >= a.type_vocab) {
        return InvalidArgument(which + ": token type " + std::to_string(type) + " is outside the " +
                               std::to_string(a.type_vocab) + " types");
      }
      impl.tokens.push_back(token);
      impl.positions.push_back(static_cast<int32_t>(a.position_offset + i));
      impl.types.push_back(type);
    }
    impl.starts.push_back(static_cast<int32_t>(impl.tokens.size()));
  }
  const int64_t rows = static_cast<int64_t>(impl.tokens.size());
  const int sequences = static_cast<int>(batch.size());
  Backend& be = *backend_;
  EncoderBuffers& b = impl.buffers;
  if (rows > impl.row_capacity || sequences > impl.sequence_capacity) {
    const int64_t rows_cap = std::max(rows, impl.row_capacity);
    const int seq_cap = std::max(sequences, impl.sequence_capacity);
    impl.storage.clear();
    auto floats = [&](int64_t n) -> Expected<float*> {
      GZ_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buf, be.Allocate(n * sizeof(float)));
      float* p = buf->as<float>();
      impl.storage.push_back(std::move(buf));
      return p;
    };
    auto ints = [&](int64_t n) -> Expected<int32_t*> {
      GZ_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buf, be.Allocate(n * sizeof(int32_t)));
      int32_t* p = buf->as<int32_t>();
      impl.storage.push_back(std::move(buf));
      return p;
    };
    const int64_t d = a.dim;
    GZ_ASSIGN_OR_RETURN(b.x, floats(rows_cap * d));
    GZ_ASSIGN_OR_RETURN(b.t, floats(rows_cap * std::max(d, a.ffn)));
    GZ_ASSIGN_OR_RETURN(b.q, floats(rows_cap * d));
    GZ_ASSIGN_OR_RETURN(b.k, floats(rows_cap * d));
    GZ_ASSIGN_OR_RETURN(b.v, floats(rows_cap * d));
    GZ_ASSIGN_OR_RETURN(b.a, floats(rows_cap * d));
    GZ_ASSIGN_OR_RETURN(b.f, floats(rows_cap * a.ffn));
    GZ_ASSIGN_OR_RETURN(b.tokens, ints(rows_cap));
    GZ_ASSIGN_OR_RETURN(b.positions, ints(rows_cap));
    GZ_ASSIGN_OR_RETURN(b.types, ints(rows_cap));
    GZ_ASSIGN_OR_RETURN(b.starts, ints(seq_cap + 1));
    impl.row_capacity = rows_cap;
    impl.sequence_capacity = seq_cap;
  }
  b.rows = rows;
  b.sequences = sequences;
  be.CopyToDevice(b.tokens, impl.tokens.data(), rows * sizeof(int32_t));
  be.CopyToDevice(b.positions, impl.positions.data(), rows * sizeof(int32_t));
  be.CopyToDevice(b.types, impl.types.data(), rows * sizeof(int32_t));
  be.CopyToDevice(b.starts, impl.starts.data(), (sequences + 1) * sizeof(int32_t));
  impl.embeddings.Run(be, b);
  for (int l = 0; l < a.layers; ++l) {
    impl.attention[l].Run(be, b);
    impl.feed_forward[l].Run(be, b);
  }
  return Status::Ok();
}

Status Encoder::Forward(std::span<const EncoderInput> batch, std::vector<float>* hidden) {
  GZ_RETURN_IF_ERROR(Run(batch));
  const EncoderBuffers& b = impl_->buffers;
  hidden->resize(b.rows * arch_.dim);
  backend_->CopyToHost(hidden->data(), b.x, hidden->size() * sizeof(float));
  return Status::Ok();
}

Status Encoder::Pool(std::span<const EncoderInput> batch, Pooling pooling,
                     std::vector<float>* pooled) {
  GZ_RETURN_IF_ERROR(Run(batch));
  Impl& impl = *impl_;
  Backend& be = *backend_;
  const EncoderBuffers& b = impl.buffers;
  const int n = b.sequences;
  const int64_t d = arch_.dim;
  // Sized for the largest batch's sequences, as the step's buffers.
  const size_t bytes = static_cast<size_t>(impl.sequence_capacity) * d * sizeof(float);
  if (!impl.pooled || impl.pooled->bytes() < bytes) {
    GZ_ASSIGN_OR_RETURN(impl.pooled, be.Allocate(bytes));
    GZ_ASSIGN_OR_RETURN(impl.last_rows,
                        be.Allocate(static_cast<size_t>(impl.sequence_capacity) * 4));
  }
  float* out = impl.pooled->as<float>();
  if (pooling == Pooling::kMean) {
    be.MeanRows({out, b.x, b.starts, n, d});
  } else if (pooling == Pooling::kCls) {
    be.GatherRows({out, b.x, b.starts, n, d});  // the starts (but the last) are first rows
  } else {
    impl.last.resize(n);
    for (int s = 0; s < n; ++s) impl.last[s] = impl.starts[s + 1] - 1;
    be.CopyToDevice(impl.last_rows->data(), impl.last.data(), n * sizeof(int32_t));
    be.GatherRows({out, b.x, impl.last_rows->as<int32_t>(), n, d});
  }
  pooled->resize(static_cast<size_t>(n) * d);
  be.CopyToHost(pooled->data(), out, pooled->size() * sizeof(float));
  return Status::Ok();
}

Status Encoder::Classify(std::span<const EncoderInput> batch, std::vector<float>* logits) {
  Impl& impl = *impl_;
  if (!impl.head) {
    return InvalidArgument(dir_ + ": " +
                           (arch_.architecture.empty() ? arch_.family : arch_.architecture) +
                           " has no sequence-classification head");
  }
  GZ_RETURN_IF_ERROR(Run(batch));
  Backend& be = *backend_;
  const EncoderBuffers& b = impl.buffers;
  const int n = b.sequences;
  const int64_t d = arch_.dim;
  // Sized for the largest batch's sequences, as the step's buffers.
  const size_t first_bytes = static_cast<size_t>(impl.sequence_capacity) * d * sizeof(float);
  if (!impl.first_rows || impl.first_rows->bytes() < first_bytes) {
    GZ_ASSIGN_OR_RETURN(impl.first_rows, be.Allocate(first_bytes));
    GZ_ASSIGN_OR_RETURN(impl.head_hidden, be.Allocate(first_bytes));
    GZ_ASSIGN_OR_RETURN(impl.logits, be.Allocate(static_cast<size_t>(impl.sequence_capacity) *
                                                 arch_.labels * sizeof(float)));
  }
  // Each sequence's first row: the starts (but the last) index the packed rows.
  be.GatherRows({impl.first_rows->as<float>(), b.x, b.starts, n, d});
  impl.head->Run(be, impl.first_rows->as<float>(), impl.head_hidden->as<float>(),
                 impl.logits->as<float>(), n);
  logits->resize(static_cast<size_t>(n) * arch_.labels);
  be.CopyToHost(logits->data(), impl.logits->data(), logits->size() * sizeof(float));
  return Status::Ok();
}

}  // namespace gizllm
