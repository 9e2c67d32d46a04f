#include "model/model.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/dtype.h"
#include "formats/safetensors.h"
#include "model/config.h"
#include "quant/linear_io.h"

namespace gizllm {

// The weights of one decoder layer, on the backend.
struct Model::Layer {
  const float* attn_norm = nullptr;  // [dim]
  const float* ffn_norm = nullptr;   // [dim]
  const float* q_norm = nullptr;     // [head_dim] or null
  const float* k_norm = nullptr;     // [head_dim] or null
  const float* q_bias = nullptr;     // [heads * head_dim] or null
  const float* k_bias = nullptr;     // [kv_heads * head_dim] or null
  const float* v_bias = nullptr;     // [kv_heads * head_dim] or null
  const float* o_bias = nullptr;     // [dim] or null
  Weight q, k, v, o;                 // [heads*head_dim, dim], [kv*hd, dim] x2, [dim, heads*hd]
  Weight gate, up, down;             // [ffn, dim] x2, [dim, ffn]
  KvLayer kv;                        // this layer's part of the page pool
};

// Step buffers, sized once by Reserve for the most rows a step may read.
struct Model::Buffers {
  int64_t rows = 0;
  int32_t slots = 0;
  int32_t max_pages = 0;
  std::unique_ptr<Buffer> x;          // [rows, dim] residual stream
  std::unique_ptr<Buffer> h;          // [rows, dim] normalized
  std::unique_ptr<Buffer> o;          // [rows, dim] output of o_proj / down
  std::unique_ptr<Buffer> q;          // [rows, heads * head_dim]
  std::unique_ptr<Buffer> k;          // [rows, kv_heads * head_dim]
  std::unique_ptr<Buffer> v;          // [rows, kv_heads * head_dim]
  std::unique_ptr<Buffer> attn;       // [rows, heads * head_dim]
  std::unique_ptr<Buffer> gate;       // [rows, ffn]
  std::unique_ptr<Buffer> up;         // [rows, ffn]
  std::unique_ptr<Buffer> picked;     // [rows, dim] normalized wanted rows
  std::unique_ptr<Buffer> logits;     // [rows, vocab]
  std::unique_ptr<Buffer> sample;     // [rows] SampleRow, for picking tokens on the backend
  std::unique_ptr<Buffer> picks;      // [rows] int32 tokens picked on the backend
  std::unique_ptr<Buffer> tokens;     // [rows] int32
  std::unique_ptr<Buffer> slot_of;    // [rows] int32
  std::unique_ptr<Buffer> positions;  // [rows] int32
  std::unique_ptr<Buffer> rotary;     // [rows] int32
  std::unique_ptr<Buffer> wanted;     // [rows] int32
  std::unique_ptr<Buffer> pages;      // [slots, max_pages] int32
};

struct Model::Impl {
  Checkpoint checkpoint;
  std::vector<std::unique_ptr<Buffer>> storage;  // device copies of weights and vectors
  Weight embed;                                  // [vocab, dim]
  Weight head;                                   // [vocab, dim]
  const float* final_norm = nullptr;             // [dim]
  const float* inv_freq = nullptr;               // [rotary_dims / 2]
  std::vector<Layer> layers;
  std::unique_ptr<Buffer> pool;  // KV pages of every layer
  int32_t pages = 0;
  Buffers buffers;
  uint64_t step_generation = 0;  // new whenever buffers or pages move (recorded steps' key)
};

Status LoadOptions::Check() const {
  if (layers == 0 || layers < -1) return InvalidArgument("layers: must be positive or -1");
  return Status::Ok();
}

namespace {

// Every buffer or page-pool change of any model gets a new number, so a step recorded by a
// backend is never replayed over memory it did not record.
uint64_t NextStepGeneration() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

// Reads a small tensor (norm weight, bias) of shape [n] as float32 on the host. Small enough to
// check that every value is finite at each load.
Expected<std::vector<float>> ReadVector(const Checkpoint& ckpt, const std::string& dir,
                                        const std::string& name, int64_t n) {
  const TensorInfo* t = ckpt.Find(name);
  if (!t) return NotFound(dir + ": tensor " + name + " is missing");
  const int64_t expected[] = {n};
  GZ_RETURN_IF_ERROR(CheckTensorShape(t->file, name, t->shape, expected));
  if (t->dtype != DType::kF32 && t->dtype != DType::kBF16 && t->dtype != DType::kF16) {
    return InvalidArgument(t->file + ": tensor " + name + " has dtype " +
                           std::string(DTypeName(t->dtype)) + ", expected F32, F16 or BF16");
  }
  GZ_RETURN_IF_ERROR(CheckFinite(*t));
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    switch (t->dtype) {
      case DType::kF32:
        std::memcpy(&v[i], t->data + 4 * i, 4);
        break;
      case DType::kBF16:
        std::memcpy(&h, t->data + 2 * i, 2);
        v[i] = Bf16ToF32(h);
        break;
      default:
        std::memcpy(&h, t->data + 2 * i, 2);
        v[i] = F16ToF32(h);
        break;
    }
  }
  return v;
}

}  // namespace

Model::~Model() = default;

Expected<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                             std::shared_ptr<Backend> backend,
                                             const LoadOptions& options) {
  GZ_RETURN_IF_ERROR(options.Check());
  GZ_ASSIGN_OR_RETURN(Arch arch, ReadArch(dir));
  const int config_layers = arch.layers;
  for (LayerKind kind : arch.kinds) {
    if (kind != LayerKind::kAttention)
      return Unimplemented(dir + "/config.json: recurrent layers are not supported yet");
  }
  if (Status s = backend->CheckAttentionShape(arch.heads, arch.kv_heads, arch.head_dim); !s.ok())
    return Unimplemented(dir + "/config.json: " + s.message());
  if (!backend->SupportsKvFormat(options.kv)) {
    return Unimplemented("KV pages of format " + KvFormatName(options.kv) + ": " +
                         backend->Describe() + " keeps them as " + KvFormatName(KvFormat::kF32) +
                         " only");
  }
  std::unique_ptr<Model> model(new Model());
  model->dir_ = dir;
  model->kv_format_ = options.kv;
  model->arch_ = arch;
  model->backend_ = std::move(backend);
  model->impl_ = std::make_unique<Impl>();
  Impl& impl = *model->impl_;
  Backend& be = *model->backend_;
  GZ_ASSIGN_OR_RETURN(impl.checkpoint, Checkpoint::Open(dir));
  const Checkpoint& ckpt = impl.checkpoint;
  // The layers to read: a converted folder cut to its first layers (convert --layers) says how
  // many it holds in its header; LoadOptions::layers may cut further.
  int layers = config_layers;
  if (auto it = ckpt.metadata().find("gizllm.layers"); it != ckpt.metadata().end()) {
    int stored = 0;
    try {
      stored = std::stoi(it->second);
    } catch (...) {
      stored = 0;
    }
    if (stored < 1 || stored > config_layers) {
      return DataLoss(dir + "/model.safetensors: header gizllm.layers \"" + it->second +
                      "\" is not a layer count in [1, " + std::to_string(config_layers) + "]");
    }
    layers = stored;
  }
  if (options.layers > 0 && options.layers < layers) layers = options.layers;
  arch.layers = layers;
  arch.kinds.resize(layers);
  model->arch_ = arch;

  // A float vector on the device.
  auto upload_floats = [&](const std::vector<float>& host) -> Expected<const float*> {
    GZ_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> buf, be.Allocate(host.size() * sizeof(float)));
    be.CopyToDevice(buf->data(), host.data(), host.size() * sizeof(float));
    const float* p = buf->as<float>();
    impl.storage.push_back(std::move(buf));
    return p;
  };
  auto vector = [&](TensorRole role, int layer) -> Expected<const float*> {
    std::string name = TensorName(arch, role, layer);
    const int64_t n = TensorShape(arch, role)[0];
    GZ_ASSIGN_OR_RETURN(std::vector<float> host, ReadVector(ckpt, dir, name, n));
    model->parameters_ += n;
    model->summary_.push_back({name, "f32", {n}, n * 4});
    return upload_floats(host);
  };
  const bool converted = ckpt.metadata().count("gizllm.format_version") > 0;
  // A matrix [rows, cols] as a Weight on the device.
  // Matrices are not scanned for NaN at load (a full read of every weight); a non-finite logit
  // stops the request that meets one instead.
  auto matrix = [&](TensorRole role, int layer) -> Expected<Weight> {
    std::string name = TensorName(arch, role, layer);
    const std::vector<int64_t> shape = TensorShape(arch, role);
    const int64_t rows = shape[0], cols = shape[1];
    const TensorInfo* t = ckpt.Find(name);
    if (!t) return NotFound(dir + ": tensor " + name + " is missing");
    if (converted && role != TensorRole::kEmbed) {
      // A converted folder: the linear's format is in the header's metadata.
      GZ_ASSIGN_OR_RETURN(Weight host, quant::ReadLinear(ckpt, name));
      const int64_t stored[] = {host.rows, host.cols};
      GZ_RETURN_IF_ERROR(CheckTensorShape(t->file, name, stored, shape));
      std::unique_ptr<Buffer> storage;
      GZ_ASSIGN_OR_RETURN(Weight w, be.PrepareWeight(host, &storage));
      if (storage) impl.storage.push_back(std::move(storage));
      model->parameters_ += rows * cols;
      model->weight_bytes_ += host.Bytes();
      model->summary_.push_back({name, FormatName(host.format), {rows, cols}, host.Bytes()});
      return w;
    }
    GZ_RETURN_IF_ERROR(CheckTensorShape(t->file, name, t->shape, shape));
    if (t->dtype != DType::kBF16 && t->dtype != DType::kF16 && t->dtype != DType::kF32)
      return InvalidArgument(t->file + ": tensor " + name + " has dtype " +
                             std::string(DTypeName(t->dtype)) + ", expected BF16, F16 or F32");
    Weight host;
    host.format = FormatOf(t->dtype);
    host.rows = rows;
    host.cols = cols;
    host.data = t->data;
    std::unique_ptr<Buffer> storage;
    GZ_ASSIGN_OR_RETURN(Weight w, be.PrepareWeight(host, &storage));
    if (storage) impl.storage.push_back(std::move(storage));
    model->parameters_ += rows * cols;
    model->weight_bytes_ += host.Bytes();
    model->summary_.push_back({name, FormatName(host.format), {rows, cols}, host.Bytes()});
    return w;
  };

  const int64_t dim = arch.dim;
  GZ_ASSIGN_OR_RETURN(impl.embed, matrix(TensorRole::kEmbed, -1));
  impl.layers.resize(arch.layers);
  for (int l = 0; l < arch.layers; ++l) {
    Layer& L = impl.layers[l];
    GZ_ASSIGN_OR_RETURN(L.attn_norm, vector(TensorRole::kAttnNorm, l));
    GZ_ASSIGN_OR_RETURN(L.ffn_norm, vector(TensorRole::kFfnNorm, l));
    GZ_ASSIGN_OR_RETURN(L.q, matrix(TensorRole::kQ, l));
    GZ_ASSIGN_OR_RETURN(L.k, matrix(TensorRole::kK, l));
    GZ_ASSIGN_OR_RETURN(L.v, matrix(TensorRole::kV, l));
    GZ_ASSIGN_OR_RETURN(L.o, matrix(TensorRole::kO, l));
    GZ_ASSIGN_OR_RETURN(L.gate, matrix(TensorRole::kGate, l));
    GZ_ASSIGN_OR_RETURN(L.up, matrix(TensorRole::kUp, l));
    GZ_ASSIGN_OR_RETURN(L.down, matrix(TensorRole::kDown, l));
    if (arch.qk_norm) {
      GZ_ASSIGN_OR_RETURN(L.q_norm, vector(TensorRole::kQNorm, l));
      GZ_ASSIGN_OR_RETURN(L.k_norm, vector(TensorRole::kKNorm, l));
    }
    if (arch.qkv_bias) {
      GZ_ASSIGN_OR_RETURN(L.q_bias, vector(TensorRole::kQBias, l));
      GZ_ASSIGN_OR_RETURN(L.k_bias, vector(TensorRole::kKBias, l));
      GZ_ASSIGN_OR_RETURN(L.v_bias, vector(TensorRole::kVBias, l));
    }
    if (arch.output_bias) {
      GZ_ASSIGN_OR_RETURN(L.o_bias, vector(TensorRole::kOBias, l));
    }
  }
  // A cut model (--layers) has no final norm and head: its logits come from the embedding.
  const bool full = layers == config_layers;
  if (full || ckpt.Find(TensorName(arch, TensorRole::kFinalNorm, -1))) {
    GZ_ASSIGN_OR_RETURN(impl.final_norm, vector(TensorRole::kFinalNorm, -1));
  } else {
    GZ_ASSIGN_OR_RETURN(impl.final_norm, upload_floats(std::vector<float>(dim, 1.0f)));
  }
  if (arch.tied_head || !ckpt.Find(TensorName(arch, TensorRole::kHead, -1))) {
    if (!arch.tied_head && full)
      return NotFound(dir + ": tensor " + TensorName(arch, TensorRole::kHead, -1) +
                      " is missing and config.json does not tie the head to the embedding");
    impl.head = impl.embed;
  } else {
    GZ_ASSIGN_OR_RETURN(impl.head, matrix(TensorRole::kHead, -1));
  }
  GZ_ASSIGN_OR_RETURN(impl.inv_freq, upload_floats(arch.rope.InvFreq()));
  return model;
}

// One layer's keys (or values) of one page, and their scales (kQ8).
int64_t Model::PagePartBytes() const {
  return static_cast<int64_t>(kPage) * arch_.KvDim() * KvFormatBytes(kv_format_);
}
int64_t Model::PageScaleBytes() const {
  return static_cast<int64_t>(kPage) * arch_.kv_heads * KvFormatScaleBytes(kv_format_);
}

int64_t Model::PageBytes() const {
  return static_cast<int64_t>(arch_.layers) * 2 * (PagePartBytes() + PageScaleBytes());
}

Status Model::AllocatePages(int32_t pages) {
  if (pages <= 0) return InvalidArgument("KV pool: pages must be positive");
  Impl& impl = *impl_;
  impl.pool.reset();
  GZ_ASSIGN_OR_RETURN(impl.pool, backend_->Allocate(static_cast<size_t>(pages) * PageBytes()));
  impl.pages = pages;
  impl.step_generation = NextStepGeneration();
  // Every layer's keys and values, then (kQ8) every layer's key and value scales.
  const int64_t layer_bytes = pages * PagePartBytes();
  const int64_t scale_bytes = pages * PageScaleBytes();
  auto* base = static_cast<uint8_t*>(impl.pool->data());
  uint8_t* scales = base + 2 * arch_.layers * layer_bytes;
  for (int l = 0; l < arch_.layers; ++l) {
    KvLayer& kv = impl.layers[l].kv;
    kv.keys = base + (2 * l) * layer_bytes;
    kv.values = base + (2 * l + 1) * layer_bytes;
    kv.format = kv_format_;
    kv.key_scales =
        scale_bytes ? reinterpret_cast<float*>(scales + (2 * l) * scale_bytes) : nullptr;
    kv.value_scales =
        scale_bytes ? reinterpret_cast<float*>(scales + (2 * l + 1) * scale_bytes) : nullptr;
  }
  return Status::Ok();
}

Status Model::Reserve(int64_t rows, int32_t slots, int32_t max_pages) {
  if (rows <= 0 || slots <= 0 || max_pages <= 0)
    return InvalidArgument("Reserve: rows, slots and max_pages must be positive");
  Buffers& b = impl_->buffers;
  if (rows <= b.rows && slots <= b.slots && max_pages <= b.max_pages) return Status::Ok();
  rows = std::max(rows, b.rows);
  slots = std::max(slots, b.slots);
  max_pages = std::max(max_pages, b.max_pages);
  const size_t f = sizeof(float), i = sizeof(int32_t);
  const Arch& a = arch_;
  auto alloc = [&](std::unique_ptr<Buffer>* out, size_t bytes) -> Status {
    out->reset();
    GZ_ASSIGN_OR_RETURN(*out, backend_->Allocate(std::max<size_t>(bytes, 64)));
    return Status::Ok();
  };
  GZ_RETURN_IF_ERROR(alloc(&b.x, rows * a.dim * f));
  GZ_RETURN_IF_ERROR(alloc(&b.h, rows * a.dim * f));
  GZ_RETURN_IF_ERROR(alloc(&b.o, rows * a.dim * f));
  GZ_RETURN_IF_ERROR(alloc(&b.q, rows * a.QDim() * f));
  GZ_RETURN_IF_ERROR(alloc(&b.k, rows * a.KvDim() * f));
  GZ_RETURN_IF_ERROR(alloc(&b.v, rows * a.KvDim() * f));
  GZ_RETURN_IF_ERROR(alloc(&b.attn, rows * a.QDim() * f));
  GZ_RETURN_IF_ERROR(alloc(&b.gate, rows * a.ffn * f));
  GZ_RETURN_IF_ERROR(alloc(&b.up, rows * a.ffn * f));
  GZ_RETURN_IF_ERROR(alloc(&b.picked, rows * a.dim * f));
  GZ_RETURN_IF_ERROR(alloc(&b.logits, rows * a.vocab * f));
  GZ_RETURN_IF_ERROR(alloc(&b.sample, rows * sizeof(SampleRow)));
  GZ_RETURN_IF_ERROR(alloc(&b.picks, rows * i));
  GZ_RETURN_IF_ERROR(alloc(&b.tokens, rows * i));
  GZ_RETURN_IF_ERROR(alloc(&b.slot_of, rows * i));
  GZ_RETURN_IF_ERROR(alloc(&b.positions, rows * i));
  GZ_RETURN_IF_ERROR(alloc(&b.rotary, rows * i));
  GZ_RETURN_IF_ERROR(alloc(&b.wanted, rows * i));
  GZ_RETURN_IF_ERROR(alloc(&b.pages, static_cast<size_t>(slots) * max_pages * i));
  b.rows = rows;
  b.slots = slots;
  b.max_pages = max_pages;
  impl_->step_generation = NextStepGeneration();
  return Status::Ok();
}

Status Model::UploadStepInputs(const Rows& rows, const PageTables& tables) {
  const int64_t n = rows.size();
  if (n == 0) return InvalidArgument("Step: no rows");
  if (static_cast<int64_t>(rows.slots.size()) != n ||
      static_cast<int64_t>(rows.positions.size()) != n ||
      static_cast<int64_t>(rows.rotary.size()) != n)
    return InvalidArgument("Step: tokens, slots, positions and rotary differ in length");
  if (!impl_->pool) return InvalidArgument("Step: AllocatePages was not called");
  GZ_RETURN_IF_ERROR(Reserve(n, std::max(1, tables.slots), std::max(1, tables.max_pages)));
  const int64_t capacity = static_cast<int64_t>(tables.max_pages) * kPage;
  for (int64_t r = 0; r < n; ++r) {
    if (rows.tokens[r] < 0 || rows.tokens[r] >= arch_.vocab)
      return InvalidArgument("Step: token " + std::to_string(rows.tokens[r]) + " of row " +
                             std::to_string(r) + " is outside the vocabulary [0, " +
                             std::to_string(arch_.vocab) + ")");
    if (rows.slots[r] < 0 || rows.slots[r] >= tables.slots)
      return InvalidArgument("Step: slot of row " + std::to_string(r) + " out of range");
    if (rows.positions[r] < 0 || rows.positions[r] >= capacity)
      return InvalidArgument("Step: position " + std::to_string(rows.positions[r]) + " of row " +
                             std::to_string(r) + " exceeds the page table");
    int32_t page = tables.pages[rows.slots[r] * tables.max_pages + rows.positions[r] / kPage];
    if (page < 0 || page >= impl_->pages)
      return InvalidArgument("Step: row " + std::to_string(r) + " maps to page " +
                             std::to_string(page) + ", not in the pool");
  }
  for (int32_t w : rows.wanted) {
    if (w < 0 || w >= n) return InvalidArgument("Step: wanted row out of range");
  }
  Buffers& b = impl_->buffers;
  Backend& be = *backend_;
  be.CopyToDevice(b.tokens->data(), rows.tokens.data(), n * sizeof(int32_t));
  be.CopyToDevice(b.slot_of->data(), rows.slots.data(), n * sizeof(int32_t));
  be.CopyToDevice(b.positions->data(), rows.positions.data(), n * sizeof(int32_t));
  be.CopyToDevice(b.rotary->data(), rows.rotary.data(), n * sizeof(int32_t));
  if (!rows.wanted.empty())
    be.CopyToDevice(b.wanted->data(), rows.wanted.data(), rows.wanted.size() * sizeof(int32_t));
  be.CopyToDevice(b.pages->data(), tables.pages,
                  static_cast<size_t>(tables.slots) * tables.max_pages * sizeof(int32_t));
  return Status::Ok();
}

Status Model::Step(const Rows& rows, const PageTables& tables, float* logits) {
  return Forward(rows, tables, {}, nullptr, logits);
}

bool Model::CanSample() const { return backend_->CanSample(); }

bool Model::PagesInHostMemory() const { return backend_->kind() == DeviceKind::kCpu; }

Status Model::StepSample(const Rows& rows, const PageTables& tables,
                         std::span<const SampleRow> params, int32_t* tokens) {
  if (!backend_->CanSample()) return Unimplemented("StepSample: the backend picks no tokens");
  if (params.size() != rows.wanted.size()) {
    return InvalidArgument("StepSample: expected one SampleRow per wanted row (" +
                           std::to_string(rows.wanted.size()) + "), got " +
                           std::to_string(params.size()));
  }
  if (rows.wanted.empty()) return Forward(rows, tables, {}, nullptr, nullptr);
  return Forward(rows, tables, {}, nullptr, nullptr, params, tokens);
}

Status Model::Hidden(const Rows& rows, const PageTables& tables, std::span<const int> layers,
                     float* out) {
  for (int l : layers) {
    if (l < 0 || l > arch_.layers)
      return InvalidArgument("Hidden: layer " + std::to_string(l) + " outside [0, " +
                             std::to_string(arch_.layers) + "]");
  }
  return Forward(rows, tables, layers, out, nullptr);
}

Status Model::Forward(const Rows& rows, const PageTables& tables,
                      std::span<const int> hidden_layers, float* hidden_out, float* logits,
                      std::span<const SampleRow> sample, int32_t* tokens) {
  GZ_RETURN_IF_ERROR(UploadStepInputs(rows, tables));
  const Arch& a = arch_;
  Impl& impl = *impl_;
  Buffers& b = impl.buffers;
  Backend& be = *backend_;
  if (tokens && !rows.wanted.empty()) {
    be.CopyToDevice(b.sample->data(), sample.data(), sample.size() * sizeof(SampleRow));
  }
  const int64_t n = rows.size();
  const float eps = static_cast<float>(a.norm_eps);
  float* x = b.x->as<float>();
  float* h = b.h->as<float>();
  float* o = b.o->as<float>();
  const int32_t* slots = b.slot_of->as<int32_t>();
  const int32_t* positions = b.positions->as<int32_t>();
  PageTable table{b.pages->as<int32_t>(), tables.max_pages};

  // Where the backend fuses the ends of its matmuls (FusesMatmul), each norm runs inside the
  // matmul that reads it and the o and down projections add into x, so x is always current.
  // Otherwise the residual stream x lags one addition behind: the output of the last block waits
  // in `o` and joins x inside the next norm (the fused residual add), unless a hidden state is
  // read.
  const bool fuse = be.FusesMatmul();
  bool pending = false;
  auto capture = [&](int layer) {
    for (size_t i = 0; i < hidden_layers.size(); ++i) {
      if (hidden_layers[i] != layer) continue;
      if (pending) {
        be.Add({x, o, n * a.dim});
        pending = false;
      }
      be.CopyToHost(hidden_out + i * n * a.dim, x, n * a.dim * sizeof(float));
    }
  };
  // The input of a matmul that reads norm(x): h after an RmsNorm op, or x with the norm fused.
  auto normed = [&](const float* weight, MatmulParams* m) {
    if (fuse) {
      m->x = x;
      m->norm = weight;
      m->norm_eps = eps;
      return;
    }
    RmsNormParams p{h, pending ? o : x, pending ? x : nullptr, weight, n, a.dim, eps};
    be.RmsNorm(p);
    pending = false;
    m->x = h;
  };
  // The output of a block: added into x (fused) or left in `o` for the next norm.
  auto residual = [&](MatmulParams* m) {
    if (fuse) {
      m->out[0] = x;
      m->accumulate = true;
    } else {
      m->out[0] = o;
      pending = true;
    }
  };

  // With no hidden states read, the op issue below depends only on the buffers, the rows, the
  // wanted rows and the page-table width (the step's inputs are already in device buffers): a
  // backend may record it once per such key and replay it.
  const bool head_wanted = (logits || tokens) && !rows.wanted.empty();
  // A backend whose buffers are host memory (the CPU, which records nothing to replay) writes
  // the logits where the caller wants them: no copy of [wanted, vocab] floats a step.
  const bool logits_in_place = logits && !tokens && be.kind() == DeviceKind::kCpu;
  const uint64_t wanted_rows = head_wanted ? rows.wanted.size() : 0;
  const bool record = hidden_layers.empty() && n < (1 << 16) && wanted_rows < (1 << 16) &&
                      tables.max_pages < (1 << 12);
  const uint64_t key = (impl.step_generation % (1 << 20)) << 44 |
                       static_cast<uint64_t>(tables.max_pages) << 32 | wanted_rows << 16 |
                       static_cast<uint64_t>(n);
  const bool replayed = record && be.ReplayStep(key);
  if (record && !replayed) be.BeginStep(key);
  if (!replayed) be.Embed({x, &impl.embed, b.tokens->as<int32_t>(), n});
  capture(0);
  for (int l = 0; !replayed && l < a.layers; ++l) {
    const Layer& L = impl.layers[l];
    MatmulParams qkv;
    normed(L.attn_norm, &qkv);
    qkv.rows = n;
    qkv.outputs = 3;
    qkv.w[0] = &L.q, qkv.w[1] = &L.k, qkv.w[2] = &L.v;
    qkv.out[0] = b.q->as<float>(), qkv.out[1] = b.k->as<float>(), qkv.out[2] = b.v->as<float>();
    qkv.bias[0] = L.q_bias, qkv.bias[1] = L.k_bias, qkv.bias[2] = L.v_bias;
    be.Matmul(qkv);
    RopeKvParams rope_kv;
    rope_kv.q = {b.q->as<float>(),
                 n,
                 a.heads,
                 a.head_dim,
                 a.rope.rotary_dims,
                 b.rotary->as<int32_t>(),
                 impl.inv_freq,
                 L.q_norm,
                 eps};
    rope_kv.k = rope_kv.q;
    rope_kv.k.x = b.k->as<float>();
    rope_kv.k.heads = a.kv_heads;
    rope_kv.k.norm = L.k_norm;
    rope_kv.kv = {L.kv,      table, b.k->as<float>(), b.v->as<float>(), slots,
                  positions, n,     a.kv_heads,       a.head_dim};
    be.RopeKv(rope_kv);
    AttentionParams att;
    att.out = b.attn->as<float>();
    att.q = b.q->as<float>();
    att.cache = L.kv;
    att.table = table;
    att.slots = slots;
    att.positions = positions;
    att.rows = n;
    att.heads = a.heads;
    att.kv_heads = a.kv_heads;
    att.head_dim = a.head_dim;
    att.scale = 1.0f / std::sqrt(static_cast<float>(a.head_dim));
    be.Attention(att);
    MatmulParams out_proj;
    out_proj.x = b.attn->as<float>();
    out_proj.rows = n;
    out_proj.w[0] = &L.o;
    out_proj.bias[0] = L.o_bias;
    residual(&out_proj);
    be.Matmul(out_proj);
    MatmulParams gate_up;
    normed(L.ffn_norm, &gate_up);
    gate_up.rows = n;
    gate_up.outputs = 2;
    gate_up.w[0] = &L.gate, gate_up.w[1] = &L.up;
    gate_up.out[0] = b.gate->as<float>(), gate_up.out[1] = b.up->as<float>();
    gate_up.swiglu = be.FusesSwiGlu();
    be.Matmul(gate_up);
    if (!gate_up.swiglu) {
      be.Glu({b.gate->as<float>(), b.gate->as<float>(), b.up->as<float>(), n * a.ffn});
    }
    MatmulParams down;
    down.x = b.gate->as<float>();
    down.rows = n;
    down.w[0] = &L.down;
    residual(&down);
    be.Matmul(down);
    capture(l + 1);
  }
  if (!replayed && head_wanted) {
    const int64_t w = static_cast<int64_t>(rows.wanted.size());
    MatmulParams head;
    if (fuse) {
      // The norm is per row: the wanted rows of x, normalized inside the head's matmul.
      be.GatherRows({b.picked->as<float>(), x, b.wanted->as<int32_t>(), w, a.dim});
      head.x = b.picked->as<float>();
      head.norm = impl.final_norm;
      head.norm_eps = eps;
    } else {
      MatmulParams unused;
      normed(impl.final_norm, &unused);
      be.GatherRows({b.picked->as<float>(), h, b.wanted->as<int32_t>(), w, a.dim});
      head.x = b.picked->as<float>();
    }
    head.rows = w;
    head.w[0] = &impl.head;
    head.out[0] = logits_in_place ? logits : b.logits->as<float>();
    be.Matmul(head);
  }
  if (record && !replayed) be.EndStep();
  if (logits && !rows.wanted.empty() && !logits_in_place) {
    be.CopyToHost(logits, b.logits->data(), rows.wanted.size() * a.vocab * sizeof(float));
  }
  if (tokens && !rows.wanted.empty()) {
    // Outside the recorded step: the parameters change every step (uploaded above).
    SampleParams p{b.picks->as<int32_t>(), b.logits->as<float>(), b.sample->as<SampleRow>(),
                   static_cast<int64_t>(rows.wanted.size()), a.vocab};
    be.Sample(p);
    be.CopyToHost(tokens, b.picks->data(), rows.wanted.size() * sizeof(int32_t));
  }
  be.Synchronize();
  return Status::Ok();
}

Status Model::CopyPageToHost(int32_t page, void* host) {
  if (page < 0 || page >= impl_->pages) return InvalidArgument("CopyPageToHost: bad page");
  const int64_t part = PagePartBytes(), scale = PageScaleBytes();
  auto* dst = static_cast<uint8_t*>(host);
  auto copy = [&](const void* base, int64_t bytes) {
    backend_->CopyToHost(dst, static_cast<const uint8_t*>(base) + page * bytes, bytes);
    dst += bytes;
  };
  for (const Layer& L : impl_->layers) {
    copy(L.kv.keys, part);
    copy(L.kv.values, part);
    if (scale > 0) {
      copy(L.kv.key_scales, scale);
      copy(L.kv.value_scales, scale);
    }
  }
  backend_->Synchronize();
  return Status::Ok();
}

Status Model::CopyPageFromHost(int32_t page, const void* host) {
  if (page < 0 || page >= impl_->pages) return InvalidArgument("CopyPageFromHost: bad page");
  const int64_t part = PagePartBytes(), scale = PageScaleBytes();
  const auto* src = static_cast<const uint8_t*>(host);
  auto copy = [&](void* base, int64_t bytes) {
    backend_->CopyToDevice(static_cast<uint8_t*>(base) + page * bytes, src, bytes);
    src += bytes;
  };
  for (const Layer& L : impl_->layers) {
    copy(L.kv.keys, part);
    copy(L.kv.values, part);
    if (scale > 0) {
      copy(L.kv.key_scales, scale);
      copy(L.kv.value_scales, scale);
    }
  }
  backend_->Synchronize();
  return Status::Ok();
}

}  // namespace gizllm
