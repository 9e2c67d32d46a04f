#include "model/model.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include "core/check.h"
#include "core/dtype.h"
#include "formats/safetensors.h"
#include "model/bitgpu_model.h"
#include "model/blocks.h"
#include "model/config.h"
#include "model/gguf_model.h"

namespace gizllm {

// One decoder layer: its blocks, each with its own weights (and the attention's KV pages).
struct Model::Layer {
  AttentionBlock attention;  // an attention layer's
  RecurrentBlock recurrent;  // a recurrent layer's
  bool is_recurrent = false;
  FeedForwardBlock feed_forward;  // a dense layer's
  MoeFeedForwardBlock moe;        // a mixture-of-experts layer's
  bool is_moe = false;
  // The page table its attention reads: 0 PageTables::pages, 1 + g window group g's.
  int32_t table = 0;
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
  std::unique_ptr<Buffer> attn_gate;  // [rows, heads * head_dim]
  std::unique_ptr<Buffer> mix;        // [rows, conv dim]
  std::unique_ptr<Buffer> z;          // [rows, value dim]
  std::unique_ptr<Buffer> b;          // [rows, v_heads]
  std::unique_ptr<Buffer> a;          // [rows, v_heads]
  std::unique_ptr<Buffer> states;     // [slots, every recurrent layer's state floats]
  std::unique_ptr<Buffer> saved;      // the states' snapshots at marks, laid out as `states`
  // Where the engine reads drafts (ReserveDrafts): the states' snapshots before a step with
  // drafts, laid out as `states`, and each row's inputs to the state updates, per recurrent
  // layer [rows, conv dim] then [rows, v_heads] twice (b, a).
  std::unique_ptr<Buffer> draft_saved;
  std::unique_ptr<Buffer> row_inputs;
  std::unique_ptr<Buffer> replay_rows;  // [3, rows] int32: a replay's step rows, slots, positions
  std::unique_ptr<Buffer> picked;  // [rows, dim] normalized wanted rows
  std::unique_ptr<Buffer> logits;  // [rows, vocab]
  std::unique_ptr<Buffer> sample;  // [rows] SampleRow, for picking tokens on the backend
  std::unique_ptr<Buffer> picks;   // [rows] int32 tokens picked on the backend
  // [masked rows, MaskWords(vocab)] the allowed tokens of the rows picked under a mask, grown on
  // demand (most steps have none).
  std::unique_ptr<Buffer> masks;
  int64_t mask_words = 0;
  std::unique_ptr<Buffer> tokens;     // [rows] int32
  std::unique_ptr<Buffer> slot_of;    // [rows] int32
  std::unique_ptr<Buffer> positions;  // [rows] int32
  std::unique_ptr<Buffer> rotary;     // [rows] int32
  std::unique_ptr<Buffer> rotary_h;   // [rows] int32: M-RoPE height positions
  std::unique_ptr<Buffer> rotary_w;   // [rows] int32: M-RoPE width positions
  std::unique_ptr<Buffer> iota;       // [rows] int32: 0, 1, 2, ... (row copies by GatherRows)
  // A step's picture rows (VisualRows), grown on demand: embeddings [rows, dim] and deepstack
  // features [layers, rows, dim].
  std::unique_ptr<Buffer> visual;
  std::unique_ptr<Buffer> deepstack;
  int64_t visual_floats = 0;
  int64_t deepstack_floats = 0;
  std::unique_ptr<Buffer> wanted;  // [rows] int32
  // The MTP layer's input (where the model has one): the normalized embeddings [rows, dim] then
  // the normalized hidden states [rows, dim]; both interleaved row by row as fc's input
  // [rows, 2 * dim] (GatherRows by `mtp_order` [2 * rows] int32).
  std::unique_ptr<Buffer> mtp_in;
  std::unique_ptr<Buffer> mtp_cat;
  std::unique_ptr<Buffer> mtp_order;
  // MTP drafts from hidden states on the device (Runner::KeepHidden, MtpDraft): each row's
  // final-normed hidden state of the last step [rows, dim]; the last MtpDraft's normed outputs
  // [rows, dim]; its rows' sources [rows] int32; greedy SampleRows [rows] for its picks.
  std::unique_ptr<Buffer> final_hidden;
  std::unique_ptr<Buffer> mtp_normed;
  std::unique_ptr<Buffer> mtp_sources;
  std::unique_ptr<Buffer> mtp_greedy;
  // MtpDraft's chained rows, [slots * kMaxMtpChain] int32 each: tokens, slots, positions, and
  // their sources (rows of the MTP run before); its picks [slots * (kMaxMtpChain + 1)].
  std::unique_ptr<Buffer> chain_tokens;
  std::unique_ptr<Buffer> chain_slots;
  std::unique_ptr<Buffer> chain_positions;
  std::unique_ptr<Buffer> chain_sources;
  std::unique_ptr<Buffer> mtp_picks;
  std::unique_ptr<Buffer> chain_order;  // [2 * slots] fc's row order of a chained run
  // [1 + window groups, slots, max_pages] int32: PageTables::pages, then the window groups'
  std::unique_ptr<Buffer> pages;

  // The blocks' view of a step of `rows` rows in these buffers: the rows' inputs as
  // UploadStepInputs left them (with M-RoPE's height and width positions where `mrope`), the
  // first page table (`table_width` pages a slot: PageTables::max_pages) and the scratch.
  StepInputs Inputs(int64_t rows, int32_t table_width, bool mrope);
};

StepInputs Model::Buffers::Inputs(int64_t rows, int32_t table_width, bool mrope) {
  StepInputs in;
  in.rows = rows;
  in.slots = slot_of->as<int32_t>();
  in.positions = positions->as<int32_t>();
  in.rotary = rotary->as<int32_t>();
  if (mrope) {
    in.rotary_h = rotary_h->as<int32_t>();
    in.rotary_w = rotary_w->as<int32_t>();
  }
  in.table = {pages->as<int32_t>(), table_width};
  in.q = q->as<float>();
  in.k = k->as<float>();
  in.v = v->as<float>();
  in.attn = attn->as<float>();
  in.gate = gate->as<float>();
  in.up = up->as<float>();
  in.attn_gate = attn_gate->as<float>();
  in.mix = mix->as<float>();
  in.z = z->as<float>();
  in.b = b->as<float>();
  in.a = a->as<float>();
  in.iota = iota->as<int32_t>();
  return in;
}

// Step keys remembered as issued once (Impl::seen_once), at most.
constexpr size_t kMaxSeenOnce = 4096;

struct Model::Impl {
  Checkpoint checkpoint;
  PlacedWeights placed;                   // device copies of weights and vectors, what was read
  Weight embed;                           // [vocab, dim]
  Weight head;                            // [vocab, dim]
  const float* final_norm = nullptr;      // [dim]
  std::vector<const float*> rope_tables;  // inv_freq of each of Arch::ropes
  // Each rope's M-RoPE tables (time, height, width; null without mrope_section).
  std::vector<std::array<const float*, 3>> mrope_tables;
  std::vector<Layer> layers;
  // The multi-token prediction layer (Arch::mtp_prefix), null where the model has none: its
  // decoder layer's KV pages follow the model's attention layers' (caches_ has one entry more).
  struct Mtp {
    Weight fc;                              // [dim, 2 * dim]
    const float* embedding_norm = nullptr;  // [dim] pre_fc_norm_embedding
    const float* hidden_norm = nullptr;     // [dim] pre_fc_norm_hidden
    const float* norm = nullptr;            // [dim] the layer's final norm
    Layer layer;                            // a full-attention decoder layer
  };
  std::unique_ptr<Mtp> mtp;
  // A pipeline stage's layers [first_layer, end_layer) (`layers` holds them from first_layer
  // on), and where its steps read and write the residual stream (Model::SetStageRows).
  int first_layer = 0;
  int end_layer = 0;
  const float* stage_in = nullptr;
  float* stage_out = nullptr;
  int64_t mtp_tensors = 0;
  int64_t mtp_parameters = 0;
  int64_t skipped_tensors = 0;   // under Arch::skipped_prefixes (a vision tower)
  std::unique_ptr<Buffer> pool;  // KV pages of every layer
  int32_t pages = 0;
  bool window_paging = false;  // the pool is laid out as KvPagingOf(caches_) says
  // The pool's regions, [pages] pages each: a layer's, or under window paging the layers' that
  // share it. Where a page's bytes lie, for host copies.
  struct Region {
    KvLayer kv;
    int64_t key_bytes = 0;    // of one page
    int64_t value_bytes = 0;  // of one page
    int64_t scale_bytes = 0;  // of one page's key scales (and as many of value scales)
  };
  std::vector<Region> regions;
  Buffers buffers;
  uint64_t step_generation = 0;  // new whenever buffers or pages move (recorded steps' key)
  // Step keys issued once and not recorded: a step is recorded the second time its key comes.
  // A shape met once (the last piece of a prompt beside the decode rows, a step with one more
  // sequence) then costs its ops' launches, not a recording and its instantiation as well.
  std::unordered_set<uint64_t> seen_once;
  // Drafts (ReserveDrafts): whether steps keep their rows' inputs, and per slot the rows of the
  // last step (first row, count), whether its draft snapshot was taken for the next step
  // (pending) and whether it holds the states from before the last step (valid).
  bool keeps_row_inputs = false;
  // MTP drafts (KeepHidden): whether steps keep their rows' final-normed hidden states on the
  // device, and the rows of the last step and of the last MtpDraft (their sources' range).
  bool keeps_hidden = false;
  int64_t hidden_rows = 0;
  // Block drafts (KeepFeatures): the layers whose hidden states every step copies to the host,
  // and the last step's copies [feature_layers, rows, dim].
  std::vector<int> feature_layers;
  std::vector<float> features;
  int64_t mtp_table_width = 0;  // the MTP rows' page-table width (PageTables::max_pages)
  // MtpDraft's head over the first draft_vocab tokens only (SetDraftVocab); empty: the head.
  Weight draft_head;
  int64_t draft_vocab = 0;
  std::vector<int64_t> step_first, step_count;
  // The position of each slot's first row in the last step (its rows are consecutive).
  std::vector<int32_t> step_first_position;
  // Whether the last step read one slot's rows alone (one sequence): only then are one slot's
  // draft-state copies and replays recorded (IssueRecorded). With many sequences their keys
  // (slot, first row, rows) rarely come again, and recording them would push the steps'
  // recordings out of the backend's bounded set of graphs.
  bool step_one_slot = false;
  std::vector<uint8_t> snapshot_pending, snapshot_valid;

  // Issues the LM head over `wanted` rows of x [rows, dim] (buffers.wanted): they are gathered
  // into buffers.picked, normalized by `norm` inside the matmul where it is given (x is
  // normalized already where not), multiplied into `logits` [wanted, vocab] and soft-capped.
  // The copy of the logits to the host is the caller's (after a recorded step ends).
  // `w`: another head than `head` (the MTP drafts' over fewer tokens), of w->rows tokens.
  void IssueHead(Backend& be, const Arch& a, const float* x, int64_t wanted, const float* norm,
                 float norm_eps, float* logits, const int32_t* index = nullptr,
                 const Weight* w = nullptr);
};

void Model::Impl::IssueHead(Backend& be, const Arch& a, const float* x, int64_t wanted,
                            const float* norm, float norm_eps, float* logits, const int32_t* index,
                            const Weight* w) {
  float* picked = buffers.picked->as<float>();
  be.GatherRows({picked, x, index ? index : buffers.wanted->as<int32_t>(), wanted, a.dim});
  MatmulParams m;
  m.x = picked;
  if (norm) {
    m.norm = norm;
    m.norm_eps = norm_eps;
  }
  m.rows = wanted;
  m.w[0] = w ? w : &head;
  m.out[0] = logits;
  be.Matmul(m);
  if (a.logit_softcap > 0) be.Softcap({logits, wanted * m.w[0]->rows, a.logit_softcap});
}

Status LoadOptions::Check() const {
  if (layers == 0 || layers < -1) return InvalidArgument("layers: must be positive or -1");
  if (expert_cache < 0) return InvalidArgument("expert_cache: must not be negative");
  if (first_layer < 0) return InvalidArgument("first_layer: must not be negative");
  if (end_layer != -1 && end_layer <= first_layer)
    return InvalidArgument("end_layer: must be -1 or after first_layer");
  return Status::Ok();
}

namespace {

// Every buffer or page-pool change of any model gets a new number, so a step recorded by a
// backend is never replayed over memory it did not record.
uint64_t NextStepGeneration() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

}  // namespace

Model::~Model() = default;

int64_t Model::Parameters() const { return impl_->placed.parameters; }
int64_t Model::MtpTensors() const { return impl_->mtp_tensors; }
bool Model::HasMtp() const { return impl_->mtp != nullptr; }
int64_t Model::MtpParameters() const { return impl_->mtp_parameters; }
int64_t Model::SkippedTensors() const { return impl_->skipped_tensors; }
int64_t Model::WeightBytes() const { return impl_->placed.bytes; }
const std::vector<WeightSummary>& Model::weights() const { return impl_->placed.summary; }
int Model::first_layer() const { return impl_->first_layer; }
int Model::end_layer() const { return impl_->end_layer; }

void Model::SetStageRows(const float* in, float* out) {
  impl_->stage_in = in;
  impl_->stage_out = out;
}

namespace {

// A model's Arch and tensors, and the layers it holds.
struct Source {
  Arch arch;
  Checkpoint checkpoint;
  int layers = 0;  // config.json's, or fewer where a converted folder is cut (convert --layers)
};

Expected<Source> OpenSource(const std::string& dir, Backend& backend) {
  // A GGUF file brings its Arch and its tensors (under the family's names) at once.
  // So does a bitgpu folder (its manifest over the data file).
  Source source;
  GgufModel gguf;
  const bool is_gguf = IsGgufPath(dir);
  const bool is_bitgpu = !is_gguf && IsBitgpuFolder(dir);
  auto reads = [&](GgmlType t) { return backend.ReadsGgml(static_cast<uint32_t>(t)); };
  if (is_gguf) {
    GZ_ASSIGN_OR_RETURN(gguf, OpenGgufModel(dir, reads));
  } else if (is_bitgpu) {
    GZ_ASSIGN_OR_RETURN(BitgpuModel bitgpu, OpenBitgpuModel(dir, reads));
    gguf.arch = std::move(bitgpu.arch);
    gguf.checkpoint = std::move(bitgpu.checkpoint);
  }
  GZ_ASSIGN_OR_RETURN(source.arch,
                      is_gguf || is_bitgpu ? Expected<Arch>(gguf.arch) : ReadArch(dir));
  if (is_gguf || is_bitgpu) {
    source.checkpoint = std::move(gguf.checkpoint);
  } else {
    GZ_ASSIGN_OR_RETURN(source.checkpoint, Checkpoint::Open(dir));
  }
  // The layers to read: a converted folder cut to its first layers (convert --layers) says how
  // many it holds in its header.
  const int config_layers = source.arch.layers;
  source.layers = config_layers;
  const auto& metadata = source.checkpoint.metadata();
  if (auto it = metadata.find("gizllm.layers"); it != metadata.end()) {
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
    source.layers = stored;
  }
  return source;
}

}  // namespace

Expected<int> Model::Layers(const std::string& dir, Backend& backend, int layers) {
  GZ_ASSIGN_OR_RETURN(Source source, OpenSource(dir, backend));
  return layers > 0 && layers < source.layers ? layers : source.layers;
}

Expected<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                             std::shared_ptr<Backend> backend,
                                             const LoadOptions& options) {
  GZ_RETURN_IF_ERROR(options.Check());
  GZ_ASSIGN_OR_RETURN(Source source, OpenSource(dir, *backend));
  Arch arch = std::move(source.arch);
  const int config_layers = arch.layers;
  for (int l = 0; l < arch.layers; ++l) {
    const LayerSpec& spec = arch.layer[l];
    if (spec.IsRecurrent() && !backend->SupportsRecurrent()) {
      return Unimplemented(dir + ": a model with recurrent layers (" + arch.family + ", layer " +
                           std::to_string(l) + " is linear_attention); recurrent layers do not " +
                           "run on " + backend->Describe() + " yet (they run on the CPU backend)");
    }
    if (spec.IsRecurrent()) {
      const RecurrentSpec& r = spec.recurrent;
      if (Status s = backend->CheckRecurrentShape(r.k_dim, r.v_dim, r.kernel); !s.ok())
        return Unimplemented(dir + "/config.json: layer " + std::to_string(l) + ": " + s.message());
    }
    const AttentionSpec& a = spec.attention;
    if (!spec.IsRecurrent()) {
      if (Status s = backend->CheckAttentionShape(a.heads, a.kv_heads, a.head_dim); !s.ok())
        return Unimplemented(dir + "/config.json: " + s.message());
    }
    if (spec.IsMoe() && !backend->SupportsMoe()) {
      return Unimplemented(dir + ": a mixture-of-experts model (" + arch.family + ", layer " +
                           std::to_string(l) + " has " + std::to_string(spec.moe.experts) +
                           " experts); mixture-of-experts layers do not run on " +
                           backend->Describe() + " (they run on the CPU and CUDA backends)");
    }
    if (spec.IsMoe()) {
      if (Status s = backend->CheckMoeShape(spec.moe.experts, spec.moe.experts_per_token); !s.ok())
        return Unimplemented(dir + "/config.json: " + s.message());
    }
  }
  const KvFormat kv = options.kv.value_or(backend->DefaultKvFormat());
  if (!backend->SupportsKvFormat(kv)) {
    std::string taken;
    for (KvFormat f : AllKvFormats())
      if (backend->SupportsKvFormat(f)) taken += (taken.empty() ? "" : ", ") + KvFormatName(f);
    return Unimplemented("KV pages of format " + KvFormatName(kv) + ": " + backend->Describe() +
                         " has no kernels for them (it takes " + taken + ")");
  }
  std::unique_ptr<Model> model(new Model());
  model->dir_ = dir;
  model->kv_format_ = kv;
  model->backend_ = std::move(backend);
  model->impl_ = std::make_unique<Impl>();
  Impl& impl = *model->impl_;
  impl.checkpoint = std::move(source.checkpoint);
  const Checkpoint& ckpt = impl.checkpoint;
  GZ_RETURN_IF_ERROR(ResolveTensorPrefix(
      &arch, [&](const std::string& name) { return ckpt.Find(name) != nullptr; }, dir));
  int layers = source.layers;
  if (options.layers > 0 && options.layers < layers) layers = options.layers;
  arch.layers = layers;
  arch.layer.resize(layers);
  model->arch_ = arch;
  const Arch& a = model->arch_;
  // A pipeline stage's layers.
  const int first = options.first_layer;
  const int end = options.end_layer < 0 ? layers : options.end_layer;
  if (end > layers || first >= end) {
    return InvalidArgument(dir + ": a stage of layers [" + std::to_string(first) + ", " +
                           std::to_string(end) + ") of a model of " + std::to_string(layers) +
                           " layers");
  }
  impl.first_layer = first;
  impl.end_layer = end;
  const bool first_stage = first == 0, last_stage = end == layers;

  WeightLoader w(ckpt, a, *model->backend_, dir, &impl.placed);
  // Experts stay on the host until the rest is placed: then they are placed too where they fit,
  // else the backend's expert cache reads them (PlaceExperts, below).
  const bool has_moe = std::any_of(a.layer.begin() + first, a.layer.begin() + end,
                                   [](const LayerSpec& l) { return l.IsMoe(); });
  const bool experts_on_host = has_moe && model->backend_->SupportsExpertCache();
  w.KeepExpertsOnHost(experts_on_host);
  for (const Rope& rope : a.ropes) {
    GZ_ASSIGN_OR_RETURN(const float* table, w.Upload(rope.InvFreq()));
    impl.rope_tables.push_back(table);
    std::array<const float*, 3> mrope = {};
    if (!rope.mrope_section.empty()) {
      for (int axis = 0; axis < 3; ++axis) {
        GZ_ASSIGN_OR_RETURN(mrope[axis], w.Upload(rope.MropeInvFreq(axis)));
      }
    }
    impl.mrope_tables.push_back(mrope);
  }
  // A vision tower's tensors are left in the file.
  for (const TensorInfo* t : ckpt.All()) {
    if (!a.mtp_prefix.empty() && t->name.rfind(a.mtp_prefix, 0) == 0) {
      ++impl.mtp_tensors;
      impl.mtp_parameters += t->Elements();
    }
    for (const std::string& prefix : a.skipped_prefixes) {
      if (t->name.rfind(prefix, 0) == 0) ++impl.skipped_tensors;
    }
  }
  // A cut model (--layers) has no final norm and head: its logits come from the embedding.
  const bool full = layers == config_layers;
  const bool has_mtp = full && impl.mtp_tensors > 0;
  const bool head_is_embed = a.tied_head || !w.Has(TensorRole::kHead, -1);
  // The embedding: the first stage's, and the last's where the head or the MTP layer reads it.
  if (first_stage || (last_stage && (head_is_embed || has_mtp))) {
    GZ_ASSIGN_OR_RETURN(impl.embed, w.Matrix(TensorRole::kEmbed, -1));
  }
  impl.layers.resize(end - first);
  for (int l = first; l < end; ++l) {
    Layer& L = impl.layers[l - first];
    L.is_recurrent = a.layer[l].IsRecurrent();
    if (L.is_recurrent) {
      GZ_RETURN_IF_ERROR(L.recurrent.Load(w, a, l));
    } else {
      GZ_RETURN_IF_ERROR(L.attention.Load(w, a, l, impl.rope_tables, impl.mrope_tables));
    }
    L.is_moe = a.layer[l].IsMoe();
    if (L.is_moe) {
      GZ_RETURN_IF_ERROR(L.moe.Load(w, a, l));
    } else {
      GZ_RETURN_IF_ERROR(L.feed_forward.Load(w, a, l));
    }
    if (L.is_recurrent) {
      CacheSpec c;
      c.kind = LayerKind::kRecurrent;
      c.state_floats = a.layer[l].recurrent.StateFloats();
      c.row_input_floats = a.layer[l].recurrent.RowInputFloats();
      model->caches_.push_back(c);
    } else {
      const AttentionSpec& spec = a.layer[l].attention;
      model->caches_.push_back(
          {LayerKind::kAttention, spec.kv_heads, spec.head_dim, spec.window, kv});
    }
  }
  // The final norm, the head and the MTP layer: the last stage's.
  if (!last_stage) {
    if (experts_on_host) GZ_RETURN_IF_ERROR(model->PlaceExperts(w, options.expert_cache));
    return model;
  }
  if (has_mtp) GZ_RETURN_IF_ERROR(model->LoadMtp());
  if (full || w.Has(TensorRole::kFinalNorm, -1)) {
    GZ_ASSIGN_OR_RETURN(impl.final_norm, w.Vector(TensorRole::kFinalNorm, -1));
  } else {
    GZ_ASSIGN_OR_RETURN(impl.final_norm, w.Upload(std::vector<float>(a.dim, 1.0f)));
  }
  if (head_is_embed) {
    if (!a.tied_head && full)
      return NotFound(dir + ": tensor " + TensorName(a, TensorRole::kHead, -1) +
                      " is missing and config.json does not tie the head to the embedding");
    impl.head = impl.embed;
  } else {
    GZ_ASSIGN_OR_RETURN(impl.head, w.Matrix(TensorRole::kHead, -1));
  }
  if (experts_on_host) GZ_RETURN_IF_ERROR(model->PlaceExperts(w, options.expert_cache));
  return model;
}

Status Model::PlaceExperts(WeightLoader& w, int64_t asked) {
  Impl& impl = *impl_;
  std::vector<MoeFeedForwardBlock*> blocks;
  for (Layer& L : impl.layers)
    if (L.is_moe) blocks.push_back(&L.moe);
  int64_t experts = 0, slot_bytes = 0;
  int top_k = 0;
  for (const MoeFeedForwardBlock* b : blocks) {
    experts += b->spec().experts;
    top_k = std::max(top_k, b->spec().experts_per_token);
    for (int e = 0; e < b->spec().experts; ++e)
      slot_bytes =
          std::max(slot_bytes, backend_->ExpertSlotBytes(b->gate(e), b->up(e), b->down(e)));
  }
  auto place_all = [&]() -> Status {
    for (MoeFeedForwardBlock* b : blocks) GZ_RETURN_IF_ERROR(b->PlaceExperts(w));
    return Status::Ok();
  };
  const int64_t all_bytes = experts * slot_bytes;
  const auto gib = [](int64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.1f", static_cast<double>(bytes) / (int64_t{1} << 30));
    return std::string(text);
  };
  int64_t slots = asked;
  if (asked == 0) {
    // Every expert where they fit beside the reserve steps keep today (max(1 GiB, 5%), as
    // engine/kv_sizing.h's), else as many slots as fit beside kExpertCacheReserve.
    const DeviceMemory memory = backend_->Memory();
    if (memory.total <= 0) return place_all();
    const int64_t small = std::max<int64_t>(int64_t{1} << 30, memory.total / 20);
    if (all_bytes + small <= memory.free) return place_all();
    const int64_t reserve = std::max<int64_t>(
        kExpertCacheMinReserve, static_cast<int64_t>(kExpertCacheReserve * memory.total));
    slots = slot_bytes > 0 ? std::max<int64_t>(0, memory.free - reserve) / slot_bytes : 0;
    if (slots < top_k) {
      return ResourceExhausted(dir_ + ": the experts (" + std::to_string(experts) + ", " +
                               gib(all_bytes) + " GiB) do not fit in the device's free memory (" +
                               gib(memory.free) + " GiB), and beside a reserve of " + gib(reserve) +
                               " GiB for the KV pages it holds " + std::to_string(slots) +
                               " expert slots of " + std::to_string(slot_bytes) +
                               " bytes, fewer than the " + std::to_string(top_k) +
                               " a layer reads at once (its top k): give --expert-cache " +
                               std::to_string(top_k) + " or more to leave less for the KV pages");
    }
  }
  if (slots >= experts) return place_all();
  if (slots < top_k) {
    return InvalidArgument("--expert-cache " + std::to_string(asked) +
                           ": too few expert slots: a layer reads the top " +
                           std::to_string(top_k) + " experts of a row at once, so the cache " +
                           "needs at least " + std::to_string(top_k) + " slots (the model has " +
                           std::to_string(experts) + " experts)");
  }
  GZ_RETURN_IF_ERROR(backend_->ReserveExpertCache(slots, slot_bytes));
  for (MoeFeedForwardBlock* b : blocks) b->UseExpertCache();
  return Status::Ok();
}

// The MTP layer's decoder layer is named as a model of one layer under Arch::mtp_prefix
// ("mtp.layers.0.", "mtp.norm"), of the spec of the model's first full-attention layer.
Status Model::LoadMtp() {
  const Arch& a = arch_;
  Impl& impl = *impl_;
  auto attention = std::find_if(a.layer.begin(), a.layer.end(),
                                [](const LayerSpec& l) { return !l.IsRecurrent(); });
  if (attention == a.layer.end())
    return Unimplemented(dir_ + ": an MTP layer (" + a.mtp_prefix +
                         "*) in a model without a full-attention layer to take its shape from");
  Arch m = a;
  m.prefixes = {a.mtp_prefix};
  m.layers = 1;
  m.layer = {*attention};
  WeightLoader w(impl.checkpoint, m, *backend_, dir_, &impl.placed);
  auto mtp = std::make_unique<Impl::Mtp>();
  GZ_ASSIGN_OR_RETURN(mtp->fc, w.NamedMatrix(a.mtp_prefix + "fc.weight", a.dim, 2 * a.dim));
  // (1 + w) norms as the model's (Arch::norm_offset), in float32.
  auto norm = [&](const std::string& name) -> Expected<const float*> {
    const int64_t shape[] = {a.dim};
    GZ_ASSIGN_OR_RETURN(std::vector<float> host, w.NamedHost(a.mtp_prefix + name, shape));
    for (float& v : host) v += a.norm_offset;
    return w.Upload(host);
  };
  GZ_ASSIGN_OR_RETURN(mtp->embedding_norm, norm("pre_fc_norm_embedding.weight"));
  GZ_ASSIGN_OR_RETURN(mtp->hidden_norm, norm("pre_fc_norm_hidden.weight"));
  GZ_ASSIGN_OR_RETURN(mtp->norm, w.Vector(TensorRole::kFinalNorm, -1));
  Layer& L = mtp->layer;
  GZ_RETURN_IF_ERROR(L.attention.Load(w, m, 0, impl.rope_tables, impl.mrope_tables));
  L.is_moe = m.layer[0].IsMoe();
  if (L.is_moe) {
    GZ_RETURN_IF_ERROR(L.moe.Load(w, m, 0));
  } else {
    GZ_RETURN_IF_ERROR(L.feed_forward.Load(w, m, 0));
  }
  const AttentionSpec& spec = m.layer[0].attention;
  caches_.push_back(
      {LayerKind::kAttention, spec.kv_heads, spec.head_dim, /*window=*/0, kv_format_});
  impl.mtp = std::move(mtp);
  return Status::Ok();
}

int64_t Model::PageBytes() const {
  int64_t bytes = 0;
  for (const CacheSpec& c : caches_) bytes += c.PageBytes();
  return bytes;
}

int64_t Model::PositionBytes(KvFormat format) const {
  int64_t bytes = 0;
  for (CacheSpec c : caches_) {
    c.format = format;
    bytes += c.PageBytes();
  }
  return bytes / kPage;
}

Status Model::SetKvFormat(KvFormat format) {
  if (impl_->pool) {
    return InvalidArgument("KV pages of format " + KvFormatName(format) +
                           ": the KV pool is allocated already");
  }
  if (!backend_->SupportsKvFormat(format)) {
    return Unimplemented("KV pages of format " + KvFormatName(format) + ": " +
                         backend_->Describe() + " has no kernels for them");
  }
  kv_format_ = format;
  for (CacheSpec& c : caches_) {
    if (c.kind == LayerKind::kAttention) c.format = format;
  }
  return Status::Ok();
}

Status Model::AllocatePages(int32_t pages, bool window_paging) {
  if (pages <= 0) return InvalidArgument("KV pool: pages must be positive");
  Impl& impl = *impl_;
  const KvPaging paging = KvPagingOf(caches_);
  if (window_paging && !paging.enabled()) {
    return InvalidArgument(
        "KV pool: window paging needs layers with and without a window, of "
        "one page size");
  }
  if (window_paging && !(first_stage() && last_stage()))
    return InvalidArgument("KV pool: no window paging in a pipeline stage");
  impl.pool.reset();
  impl.regions.clear();
  const int64_t page_bytes = window_paging ? paging.page_bytes : PageBytes();
  // (A pipeline stage of recurrent layers alone has no pages' bytes.)
  GZ_ASSIGN_OR_RETURN(
      impl.pool, backend_->Allocate(std::max<size_t>(static_cast<size_t>(pages) * page_bytes, 64)));
  impl.pages = pages;
  impl.window_paging = window_paging;
  impl.step_generation = NextStepGeneration();
  // Region by region: all pages' keys, all pages' values, then (q8, rotated) their scales. A
  // region is a layer's, or under window paging a layer without a window's and the window
  // layers' that reuse it (window layer i: region i % regions, table 1 + i / regions).
  auto* at = static_cast<uint8_t*>(impl.pool->data());
  int32_t full = 0, windowed = 0;
  // The MTP layer's cache, the last of caches_, is a layer without a window after the model's.
  for (size_t l = 0; l < caches_.size(); ++l) {
    const CacheSpec& c = caches_[l];
    if (c.kind != LayerKind::kAttention) continue;
    Layer& layer = l < impl.layers.size() ? impl.layers[l] : impl.mtp->layer;
    layer.table = 0;
    if (window_paging && c.window > 0) {
      layer.table = 1 + windowed++ / paging.regions;
      continue;  // its region is set below, once every region exists
    }
    Impl::Region region;
    region.key_bytes = static_cast<int64_t>(kPage) * c.kv_heads * KvKeyBytes(c.format, c.head_dim);
    region.value_bytes =
        static_cast<int64_t>(kPage) * c.kv_heads * KvValueBytes(c.format, c.head_dim);
    region.scale_bytes =
        static_cast<int64_t>(kPage) * c.kv_heads * KvFormatScaleBytes(c.format, c.head_dim);
    const int64_t key_part = pages * region.key_bytes;
    const int64_t value_part = pages * region.value_bytes;
    const int64_t scales = pages * region.scale_bytes;
    KvLayer& kv = region.kv;
    kv.format = c.format;
    kv.keys = at;
    kv.values = at + key_part;
    at += key_part + value_part;
    kv.key_scales = scales ? reinterpret_cast<float*>(at) : nullptr;
    kv.value_scales = scales ? reinterpret_cast<float*>(at + scales) : nullptr;
    at += 2 * scales;
    layer.attention.kv = kv;
    impl.regions.push_back(region);
    ++full;
  }
  if (window_paging) {
    windowed = 0;
    for (size_t l = 0; l < impl.layers.size(); ++l) {
      const CacheSpec& c = caches_[l];
      if (c.kind != LayerKind::kAttention || c.window == 0) continue;
      impl.layers[l].attention.kv = impl.regions[windowed % paging.regions].kv;
      ++windowed;
    }
  }
  DCHECK(!window_paging || full == paging.regions);
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
  // The blocks' scratch, for the widest layer.
  int64_t q_dim = 1, kv_dim = 1, ffn = 1, gate_dim = 1, conv_dim = 1, value_dim = 1, v_heads = 1;
  int64_t state_floats = 0;  // of one slot, every recurrent layer
  // The layers of this stage (the whole model's but in a pipeline), and the MTP layer's, of the
  // model's first full-attention layer (LoadMtp), which a last stage may not hold.
  std::vector<LayerSpec> specs(a.layer.begin() + impl_->first_layer,
                               a.layer.begin() + impl_->end_layer);
  if (impl_->mtp) {
    auto attention = std::find_if(a.layer.begin(), a.layer.end(),
                                  [](const LayerSpec& l) { return !l.IsRecurrent(); });
    if (attention != a.layer.end()) specs.push_back(*attention);
  }
  for (const LayerSpec& spec : specs) {
    if (spec.IsRecurrent()) {
      const RecurrentSpec& r = spec.recurrent;
      conv_dim = std::max(conv_dim, r.ConvDim());
      value_dim = std::max(value_dim, r.ValueDim());
      v_heads = std::max<int64_t>(v_heads, r.v_heads);
      state_floats += r.StateFloats();
    } else {
      q_dim = std::max(q_dim, spec.attention.QDim());
      kv_dim = std::max(kv_dim, spec.attention.KvDim());
      if (spec.attention.output_gate) gate_dim = std::max(gate_dim, spec.attention.QDim());
    }
    if (!spec.IsMoe()) ffn = std::max(ffn, spec.feed_forward.ffn);
  }
  GZ_RETURN_IF_ERROR(alloc(&b.q, rows * q_dim * f));
  GZ_RETURN_IF_ERROR(alloc(&b.k, rows * kv_dim * f));
  GZ_RETURN_IF_ERROR(alloc(&b.v, rows * kv_dim * f));
  GZ_RETURN_IF_ERROR(alloc(&b.attn, rows * std::max(q_dim, value_dim) * f));
  GZ_RETURN_IF_ERROR(alloc(&b.attn_gate, rows * gate_dim * f));
  GZ_RETURN_IF_ERROR(alloc(&b.mix, rows * conv_dim * f));
  GZ_RETURN_IF_ERROR(alloc(&b.z, rows * value_dim * f));
  GZ_RETURN_IF_ERROR(alloc(&b.b, rows * v_heads * f));
  GZ_RETURN_IF_ERROR(alloc(&b.a, rows * v_heads * f));
  if (state_floats > 0 && impl_->keeps_row_inputs) {
    // The rows' inputs, for the most rows a step reads.
    int64_t row_floats = 0;
    for (const LayerSpec& spec : specs) {
      if (spec.IsRecurrent()) row_floats += spec.recurrent.RowInputFloats();
    }
    GZ_RETURN_IF_ERROR(alloc(&b.row_inputs, static_cast<size_t>(rows) * row_floats * f));
    GZ_RETURN_IF_ERROR(alloc(&b.replay_rows, static_cast<size_t>(rows) * 3 * sizeof(int32_t)));
    float* at = b.row_inputs->as<float>();
    for (Layer& layer : impl_->layers) {
      if (!layer.is_recurrent) continue;
      RecurrentBlock& block = layer.recurrent;
      const RecurrentSpec& r = block.spec();
      block.row_mix = at;
      block.row_b = at + rows * r.ConvDim();
      block.row_a = block.row_b + rows * r.v_heads;
      at += rows * r.RowInputFloats();
    }
  }
  if (state_floats > 0 && impl_->keeps_row_inputs && (slots > b.slots || !b.draft_saved)) {
    GZ_RETURN_IF_ERROR(alloc(&b.draft_saved, static_cast<size_t>(slots) * state_floats * f));
  }
  impl_->step_first.resize(slots, 0);
  impl_->step_count.resize(slots, 0);
  impl_->step_first_position.resize(slots, 0);
  impl_->snapshot_pending.resize(slots, 0);
  impl_->snapshot_valid.resize(slots, 0);
  if (state_floats > 0 && slots > b.slots) {
    // The recurrent layers' states, slot by slot; what the slots held carries over.
    // Each layer's part: [slots, kernel - 1, conv dim] then [slots, v_heads, k_dim, v_dim].
    std::unique_ptr<Buffer> old = std::move(b.states);
    GZ_RETURN_IF_ERROR(alloc(&b.states, static_cast<size_t>(slots) * state_floats * f));
    // Snapshots taken before are dropped: the engine that took them is gone when slots grow.
    GZ_RETURN_IF_ERROR(alloc(&b.saved, static_cast<size_t>(slots) * state_floats * f));
    auto move = [&](float* to, const float* from, int64_t floats) {
      if (!from || floats == 0) return;
      std::vector<float> host(floats);
      backend_->CopyToHost(host.data(), from, floats * f);
      backend_->CopyToDevice(to, host.data(), floats * f);
    };
    float* at = b.states->as<float>();
    for (size_t l = 0; l < impl_->layers.size(); ++l) {
      if (!impl_->layers[l].is_recurrent) continue;
      RecurrentBlock& block = impl_->layers[l].recurrent;
      const RecurrentSpec& r = block.spec();
      const int64_t conv = static_cast<int64_t>(r.kernel - 1) * r.ConvDim();
      const int64_t delta = static_cast<int64_t>(r.v_heads) * r.k_dim * r.v_dim;
      if (old) move(at, block.conv_states, b.slots * conv);
      block.conv_states = at;
      at += slots * conv;
      if (old) move(at, block.delta_states, b.slots * delta);
      block.delta_states = at;
      at += slots * delta;
    }
  }
  GZ_RETURN_IF_ERROR(alloc(&b.gate, rows * ffn * f));
  GZ_RETURN_IF_ERROR(alloc(&b.up, rows * ffn * f));
  // The head's, on the last stage alone.
  const int64_t head_rows = last_stage() ? rows : 1;
  GZ_RETURN_IF_ERROR(alloc(&b.picked, head_rows * a.dim * f));
  GZ_RETURN_IF_ERROR(alloc(&b.logits, head_rows * a.vocab * f));
  GZ_RETURN_IF_ERROR(alloc(&b.sample, rows * sizeof(SampleRow)));
  GZ_RETURN_IF_ERROR(alloc(&b.picks, rows * i));
  GZ_RETURN_IF_ERROR(alloc(&b.tokens, rows * i));
  GZ_RETURN_IF_ERROR(alloc(&b.slot_of, rows * i));
  GZ_RETURN_IF_ERROR(alloc(&b.positions, rows * i));
  GZ_RETURN_IF_ERROR(alloc(&b.rotary, rows * i));
  GZ_RETURN_IF_ERROR(alloc(&b.rotary_h, rows * i));
  GZ_RETURN_IF_ERROR(alloc(&b.rotary_w, rows * i));
  GZ_RETURN_IF_ERROR(alloc(&b.iota, rows * i));
  {
    std::vector<int32_t> iota(rows);
    for (int64_t r = 0; r < rows; ++r) iota[r] = static_cast<int32_t>(r);
    backend_->CopyToDevice(b.iota->data(), iota.data(), rows * i);
  }
  GZ_RETURN_IF_ERROR(alloc(&b.wanted, rows * i));
  if (impl_->mtp) {
    GZ_RETURN_IF_ERROR(alloc(&b.mtp_in, 2 * rows * a.dim * f));
    GZ_RETURN_IF_ERROR(alloc(&b.mtp_cat, 2 * rows * a.dim * f));
    GZ_RETURN_IF_ERROR(alloc(&b.mtp_order, 2 * rows * i));
    GZ_RETURN_IF_ERROR(alloc(&b.final_hidden, rows * a.dim * f));
    GZ_RETURN_IF_ERROR(alloc(&b.mtp_normed, rows * a.dim * f));
    GZ_RETURN_IF_ERROR(alloc(&b.mtp_sources, rows * i));
    GZ_RETURN_IF_ERROR(alloc(&b.mtp_greedy, rows * sizeof(SampleRow)));
    const int64_t chain = static_cast<int64_t>(slots) * kMaxMtpChain;
    GZ_RETURN_IF_ERROR(alloc(&b.chain_tokens, chain * i));
    GZ_RETURN_IF_ERROR(alloc(&b.chain_slots, chain * i));
    GZ_RETURN_IF_ERROR(alloc(&b.chain_positions, chain * i));
    GZ_RETURN_IF_ERROR(alloc(&b.chain_sources, chain * i));
    GZ_RETURN_IF_ERROR(alloc(&b.mtp_picks, (chain + slots) * i));
    GZ_RETURN_IF_ERROR(alloc(&b.chain_order, 2 * static_cast<int64_t>(slots) * i));
    const std::vector<SampleRow> greedy(rows);  // temperature 0: the largest logit
    backend_->CopyToDevice(b.mtp_greedy->data(), greedy.data(), rows * sizeof(SampleRow));
    impl_->hidden_rows = 0;
  }
  const int32_t tables = 1 + KvPagingOf(caches_).window_groups;
  GZ_RETURN_IF_ERROR(alloc(&b.pages, static_cast<size_t>(tables) * slots * max_pages * i));
  b.rows = rows;
  b.slots = slots;
  b.max_pages = max_pages;
  impl_->step_generation = NextStepGeneration();
  return Status::Ok();
}

Status Model::UploadStepInputs(const Rows& rows, const PageTables& tables, bool recurrent_order) {
  const int64_t n = rows.size();
  if (n == 0) return InvalidArgument("Step: no rows");
  if (static_cast<int64_t>(rows.slots.size()) != n ||
      static_cast<int64_t>(rows.positions.size()) != n ||
      static_cast<int64_t>(rows.rotary.size()) != n)
    return InvalidArgument("Step: tokens, slots, positions and rotary differ in length");
  if (!impl_->pool) return InvalidArgument("Step: AllocatePages was not called");
  GZ_RETURN_IF_ERROR(Reserve(n, std::max(1, tables.slots), std::max(1, tables.max_pages)));
  const int64_t capacity = static_cast<int64_t>(tables.max_pages) * kPage;
  const int32_t window_groups = impl_->window_paging ? KvPagingOf(caches_).window_groups : 0;
  const int64_t table_size = static_cast<int64_t>(tables.slots) * tables.max_pages;
  if (impl_->window_paging && tables.window_pages == nullptr)
    return InvalidArgument("Step: the pool pages window layers apart, and no window page tables");
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
    const int64_t block = rows.slots[r] * tables.max_pages + rows.positions[r] / kPage;
    int32_t page = tables.pages[block];
    if (page < 0 || page >= impl_->pages)
      return InvalidArgument("Step: row " + std::to_string(r) + " maps to page " +
                             std::to_string(page) + ", not in the pool");
    for (int32_t g = 0; g < window_groups; ++g) {
      page = tables.window_pages[g * table_size + block];
      if (page < 0 || page >= impl_->pages)
        return InvalidArgument("Step: row " + std::to_string(r) + " maps to page " +
                               std::to_string(page) + " of window group " + std::to_string(g) +
                               ", not in the pool");
    }
  }
  for (int32_t w : rows.wanted) {
    if (w < 0 || w >= n) return InvalidArgument("Step: wanted row out of range");
  }
  const bool mrope = !rows.rotary_h.empty();
  if (mrope && (static_cast<int64_t>(rows.rotary_h.size()) != n ||
                static_cast<int64_t>(rows.rotary_w.size()) != n))
    return InvalidArgument("Step: rotary_h and rotary_w must hold one position per row");
  if (mrope && (impl_->mrope_tables.empty() || !impl_->mrope_tables[0][0]))
    return InvalidArgument("Step: rows with three rotary positions, but " + arch_.family +
                           " has no M-RoPE (rope_parameters.mrope_section)");
  const VisualRows& visual = rows.visual;
  if (!visual.empty()) {
    const int64_t count = visual.size();
    for (int64_t j = 0; j < count; ++j) {
      if (visual.rows[j] < 0 || visual.rows[j] >= n ||
          (j > 0 && visual.rows[j] <= visual.rows[j - 1]))
        return InvalidArgument("Step: visual rows must be ascending rows of the step");
    }
    if (visual.layers < 0 || visual.layers > arch_.layers)
      return InvalidArgument("Step: visual rows with " + std::to_string(visual.layers) +
                             " deepstack features, the model has " +
                             std::to_string(arch_.layers) + " layers");
    if (!visual.sources.empty()) {
      if (static_cast<int64_t>(visual.sources.size()) != count || !visual.embeddings.empty() ||
          !visual.deepstack.empty())
        return InvalidArgument("Step: visual rows in device memory need one source a row and "
                               "no host rows");
      for (const VisualRows::Source& src : visual.sources) {
        if (src.row == nullptr || src.layers < 0 || src.layers > visual.layers ||
            (src.layers > 0 && src.plane < arch_.dim))
          return InvalidArgument("Step: a visual row's source is empty or its deepstack "
                                 "features are outside the step's layers");
      }
    } else {
      if (static_cast<int64_t>(visual.embeddings.size()) != count * arch_.dim)
        return InvalidArgument("Step: visual embeddings must be [" + std::to_string(count) +
                               ", " + std::to_string(arch_.dim) + "]");
      if (static_cast<int64_t>(visual.deepstack.size()) != visual.layers * count * arch_.dim)
        return InvalidArgument("Step: visual deepstack features must be [layers <= " +
                               std::to_string(arch_.layers) + ", " + std::to_string(count) +
                               ", " + std::to_string(arch_.dim) + "]");
    }
  }
  if (recurrent_order && HasSlotStates(caches_)) {
    // The recurrent ops carry a slot's state from row to row: its rows adjacent, in order.
    std::vector<char> seen(tables.slots, 0);
    seen[rows.slots[0]] = 1;
    for (int64_t r = 1; r < n; ++r) {
      if (rows.slots[r] != rows.slots[r - 1]) {
        if (seen[rows.slots[r]])
          return InvalidArgument("Step: the rows of slot " + std::to_string(rows.slots[r]) +
                                 " are not adjacent (a model with recurrent layers)");
        seen[rows.slots[r]] = 1;
      } else if (rows.positions[r] != rows.positions[r - 1] + 1) {
        return InvalidArgument("Step: rows " + std::to_string(r - 1) + " and " + std::to_string(r) +
                               " of slot " + std::to_string(rows.slots[r]) +
                               " are not at consecutive positions (a model with recurrent "
                               "layers)");
      }
    }
  }
  Buffers& b = impl_->buffers;
  Backend& be = *backend_;
  be.CopyToDevice(b.tokens->data(), rows.tokens.data(), n * sizeof(int32_t));
  be.CopyToDevice(b.slot_of->data(), rows.slots.data(), n * sizeof(int32_t));
  be.CopyToDevice(b.positions->data(), rows.positions.data(), n * sizeof(int32_t));
  be.CopyToDevice(b.rotary->data(), rows.rotary.data(), n * sizeof(int32_t));
  if (mrope) {
    be.CopyToDevice(b.rotary_h->data(), rows.rotary_h.data(), n * sizeof(int32_t));
    be.CopyToDevice(b.rotary_w->data(), rows.rotary_w.data(), n * sizeof(int32_t));
  }
  if (!visual.empty() && visual.sources.empty()) {
    auto grow = [&](std::unique_ptr<Buffer>* buf, int64_t* have, int64_t floats) -> Status {
      if (floats <= *have) return Status::Ok();
      buf->reset();
      GZ_ASSIGN_OR_RETURN(*buf, be.Allocate(std::max<size_t>(floats * sizeof(float), 64)));
      *have = floats;
      return Status::Ok();
    };
    GZ_RETURN_IF_ERROR(grow(&b.visual, &b.visual_floats, visual.embeddings.size()));
    be.CopyToDevice(b.visual->data(), visual.embeddings.data(),
                    visual.embeddings.size() * sizeof(float));
    if (!visual.deepstack.empty()) {
      GZ_RETURN_IF_ERROR(grow(&b.deepstack, &b.deepstack_floats, visual.deepstack.size()));
      be.CopyToDevice(b.deepstack->data(), visual.deepstack.data(),
                      visual.deepstack.size() * sizeof(float));
    }
  }
  if (!rows.wanted.empty())
    be.CopyToDevice(b.wanted->data(), rows.wanted.data(), rows.wanted.size() * sizeof(int32_t));
  be.CopyToDevice(b.pages->data(), tables.pages, table_size * sizeof(int32_t));
  // Window group g's table at b.pages + (1 + g) * [the buffer's slots, max_pages], so that the
  // tables' places depend on the buffers alone (as a recorded step's pointers must).
  for (int32_t g = 0; g < window_groups; ++g) {
    be.CopyToDevice(b.pages->as<int32_t>() + (1 + g) * static_cast<int64_t>(b.slots) * b.max_pages,
                    tables.window_pages + g * table_size, table_size * sizeof(int32_t));
  }
  return Status::Ok();
}

Status Model::Step(const Rows& rows, const PageTables& tables, float* logits) {
  if (!impl_->feature_layers.empty()) {
    impl_->features.resize(impl_->feature_layers.size() * rows.size() * arch_.dim);
    return Forward(rows, tables, impl_->feature_layers, impl_->features.data(), logits);
  }
  return Forward(rows, tables, {}, nullptr, logits);
}

Status Model::KeepFeatures(std::span<const int> layers) {
  if (!last_stage() || impl_->first_layer != 0) {
    return Unimplemented("KeepFeatures: a pipeline stage keeps no hidden states for drafts");
  }
  for (int l : layers) {
    if (l < 1 || l > arch_.layers + 1) {
      return InvalidArgument("KeepFeatures: layer " + std::to_string(l) + " outside [1, " +
                             std::to_string(arch_.layers + 1) + "] (the outputs of " + dir_ +
                             "'s layers, the last also after the final norm)");
    }
  }
  impl_->feature_layers.assign(layers.begin(), layers.end());
  return Status::Ok();
}

const float* Model::Features() const {
  return impl_->features.empty() ? nullptr : impl_->features.data();
}

Status Model::EmbedTokens(std::span<const int32_t> tokens, float* out) {
  Buffers& b = impl_->buffers;
  if (impl_->first_layer != 0) return Unimplemented("EmbedTokens: not the first pipeline stage");
  if (b.rows == 0) return InvalidArgument("EmbedTokens: Reserve was not called");
  for (int32_t t : tokens) {
    if (t < 0 || t >= arch_.vocab) {
      return InvalidArgument("EmbedTokens: token " + std::to_string(t) + " outside [0, " +
                             std::to_string(arch_.vocab) + ")");
    }
  }
  Backend& be = *backend_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int64_t r0 = 0; r0 < n; r0 += b.rows) {
    const int64_t m = std::min(b.rows, n - r0);
    be.CopyToDevice(b.tokens->data(), tokens.data() + r0, m * sizeof(int32_t));
    be.Embed({b.h->as<float>(), &impl_->embed, b.tokens->as<int32_t>(), m, arch_.embed_scale});
    be.CopyToHost(out + r0 * arch_.dim, b.h->data(), m * arch_.dim * sizeof(float));
  }
  be.Synchronize();
  return Status::Ok();
}

Status Model::HeadLogits(const float* x, int64_t rows, float* logits) {
  Buffers& b = impl_->buffers;
  if (!last_stage()) return Unimplemented("HeadLogits: not the last pipeline stage");
  if (b.rows == 0) return InvalidArgument("HeadLogits: Reserve was not called");
  Backend& be = *backend_;
  for (int64_t r0 = 0; r0 < rows; r0 += b.rows) {
    const int64_t m = std::min(b.rows, rows - r0);
    be.CopyToDevice(b.h->data(), x + r0 * arch_.dim, m * arch_.dim * sizeof(float));
    impl_->IssueHead(be, arch_, b.h->as<float>(), m, /*norm=*/nullptr, 0.0f,
                     b.logits->as<float>(), b.iota->as<int32_t>());
    be.CopyToHost(logits + r0 * arch_.vocab, b.logits->data(), m * arch_.vocab * sizeof(float));
  }
  be.Synchronize();
  return Status::Ok();
}

bool Model::CanSample() const { return backend_->CanSample(); }

bool Model::PagesInHostMemory() const { return backend_->kind() == DeviceKind::kCpu; }

Status Model::StepSample(const Rows& rows, const PageTables& tables,
                         std::span<const SampleRow> params, const SampleMasks& masks,
                         int32_t* tokens) {
  if (!backend_->CanSample()) return Unimplemented("StepSample: the backend picks no tokens");
  if (params.size() != rows.wanted.size()) {
    return InvalidArgument("StepSample: expected one SampleRow per wanted row (" +
                           std::to_string(rows.wanted.size()) + "), got " +
                           std::to_string(params.size()));
  }
  std::span<const int> layers;
  float* features = nullptr;
  if (!impl_->feature_layers.empty()) {
    impl_->features.resize(impl_->feature_layers.size() * rows.size() * arch_.dim);
    layers = impl_->feature_layers;
    features = impl_->features.data();
  }
  if (rows.wanted.empty()) return Forward(rows, tables, layers, features, nullptr);
  return Forward(rows, tables, layers, features, nullptr, params, &masks, tokens);
}

Status Model::Hidden(const Rows& rows, const PageTables& tables, std::span<const int> layers,
                     float* out) {
  for (int l : layers) {
    if (l < 0 || l > arch_.layers + 1)
      return InvalidArgument("Hidden: layer " + std::to_string(l) + " outside [0, " +
                             std::to_string(arch_.layers + 1) + "]");
  }
  return Forward(rows, tables, layers, out, nullptr);
}

Status Model::StepHidden(const Rows& rows, const PageTables& tables, float* logits, float* hidden) {
  const int final_normed[] = {arch_.layers + 1};
  return Forward(rows, tables, final_normed, hidden, logits);
}

Status Model::KeepHidden() {
  Impl& impl = *impl_;
  if (!impl.mtp) return Unimplemented("KeepHidden: " + dir_ + " has no MTP layer");
  if (impl.keeps_hidden) return Status::Ok();
  impl.keeps_hidden = true;
  impl.hidden_rows = 0;
  impl.step_generation = NextStepGeneration();  // the steps recorded so far lack the norm
  return Status::Ok();
}

Status Model::CheckMtpRows(const Rows& rows, const char* who) const {
  if (!impl_->mtp) return Unimplemented(std::string(who) + ": " + dir_ + " has no MTP layer");
  if (!rows.visual.empty() || !rows.rotary_h.empty())
    return InvalidArgument(std::string(who) +
                           ": MTP rows are text rows (no pictures, one rotary position)");
  return Status::Ok();
}

// x = fc(concat(norm_e(embed(token)), norm_h(state))), then the decoder layer over the MTP
// layer's own pages and its norm into `normed`: the ops of the main step. The step's inputs
// are uploaded and the rows' hidden states are in state (mtp_in's second half).
void Model::IssueMtpLayer(int64_t n, float* normed, const int32_t* tokens, const StepInputs* inputs,
                          const int32_t* order) {
  Impl& impl = *impl_;
  const Arch& a = arch_;
  const Impl::Mtp& mtp = *impl.mtp;
  Buffers& b = impl.buffers;
  Backend& be = *backend_;
  const float eps = static_cast<float>(a.norm_eps);
  float* embedded = b.mtp_in->as<float>();  // [n, dim]
  float* state = embedded + n * a.dim;      // [n, dim]
  be.Embed({embedded, &impl.embed, tokens ? tokens : b.tokens->as<int32_t>(), n, a.embed_scale});
  be.RmsNorm({embedded, embedded, nullptr, mtp.embedding_norm, n, a.dim, eps});
  be.RmsNorm({state, state, nullptr, mtp.hidden_norm, n, a.dim, eps});
  be.GatherRows(
      {b.mtp_cat->as<float>(), embedded, order ? order : b.mtp_order->as<int32_t>(), 2 * n, a.dim});
  MatmulParams fc;
  fc.x = b.mtp_cat->as<float>();
  fc.rows = n;
  fc.w[0] = &mtp.fc;
  fc.out[0] = b.x->as<float>();
  be.Matmul(fc);

  StepBuilder step(be, b.x->as<float>(), b.h->as<float>(), b.o->as<float>(), n, a.dim, eps);
  const StepInputs in =
      inputs ? *inputs : b.Inputs(n, static_cast<int32_t>(impl.mtp_table_width), /*mrope=*/false);
  mtp.layer.attention.Issue(step, in);
  if (mtp.layer.is_moe) {
    mtp.layer.moe.Issue(step, in);
  } else {
    mtp.layer.feed_forward.Issue(step, in);
  }
  be.RmsNorm({normed, step.Current(), nullptr, mtp.norm, n, a.dim, eps});
}

// The head over the wanted rows of `normed` (index: null, the step's wanted rows) into the
// logits buffer.
void Model::IssueMtpHead(const float* normed, int64_t wanted, const int32_t* index,
                         const Weight* head) {
  impl_->IssueHead(*backend_, arch_, normed, wanted, /*norm=*/nullptr, 0.0f,
                   impl_->buffers.logits->as<float>(), index, head);
}

Status Model::SetDraftVocab(int64_t tokens) {
  Impl& impl = *impl_;
  if (!impl.mtp) return Unimplemented("draft vocabulary: " + dir_ + " has no MTP layer");
  if (tokens < 1 || tokens > arch_.vocab)
    return InvalidArgument("draft vocabulary: expected 1 to " + std::to_string(arch_.vocab) +
                           " tokens, got " + std::to_string(tokens));
  impl.step_generation = NextStepGeneration();  // recorded drafts read the other head
  if (tokens == arch_.vocab) {
    impl.draft_head = Weight{};
    impl.draft_vocab = 0;
    return Status::Ok();
  }
  WeightLoader w(impl.checkpoint, arch_, *backend_, dir_, &impl.placed);
  const TensorRole role =
      arch_.tied_head || !w.Has(TensorRole::kHead, -1) ? TensorRole::kEmbed : TensorRole::kHead;
  const WeightLoader::Rows rows[] = {{0, tokens}};
  GZ_ASSIGN_OR_RETURN(impl.draft_head, w.MatrixRows(role, -1, rows, "MTP draft head"));
  impl.draft_vocab = tokens;
  return Status::Ok();
}

void Model::UploadMtpOrder(int64_t n, Buffer* to) {
  std::vector<int32_t> order(2 * n);  // fc's input row r: embedded r, then state r
  for (int64_t r = 0; r < n; ++r) {
    order[2 * r] = static_cast<int32_t>(r);
    order[2 * r + 1] = static_cast<int32_t>(n + r);
  }
  backend_->CopyToDevice((to ? to : impl_->buffers.mtp_order.get())->data(), order.data(),
                         2 * n * sizeof(int32_t));
}

Status Model::MtpStep(const Rows& rows, const PageTables& tables, const float* hidden,
                      float* normed, float* logits) {
  GZ_RETURN_IF_ERROR(CheckMtpRows(rows, "MtpStep"));
  if (!hidden) return InvalidArgument("MtpStep: no hidden states");
  GZ_RETURN_IF_ERROR(UploadStepInputs(rows, tables));
  Impl& impl = *impl_;
  Buffers& b = impl.buffers;
  Backend& be = *backend_;
  const int64_t n = rows.size();
  const int64_t dim = arch_.dim;
  impl.mtp_table_width = tables.max_pages;
  UploadMtpOrder(n);
  be.CopyToDevice(b.mtp_in->as<float>() + n * dim, hidden, n * dim * sizeof(float));
  float* out = b.mtp_normed->as<float>();  // [n, dim] the rows' outputs after the layer's norm
  IssueMtpLayer(n, out);
  if (normed) be.CopyToHost(normed, out, n * dim * sizeof(float));
  if (logits && !rows.wanted.empty()) {
    const int64_t w = static_cast<int64_t>(rows.wanted.size());
    IssueMtpHead(out, w);
    be.CopyToHost(logits, b.logits->data(), w * arch_.vocab * sizeof(float));
  }
  be.Synchronize();
  return Status::Ok();
}

Status Model::MtpDraft(const Rows& rows, const PageTables& tables, std::span<const int32_t> sources,
                       int32_t chained, int32_t* tokens) {
  GZ_RETURN_IF_ERROR(CheckMtpRows(rows, "MtpDraft"));
  Impl& impl = *impl_;
  if (!impl.keeps_hidden) return InvalidArgument("MtpDraft: KeepHidden was not called");
  const int64_t n = rows.size();
  const int64_t w = static_cast<int64_t>(rows.wanted.size());
  if (static_cast<int64_t>(sources.size()) != n)
    return InvalidArgument("MtpDraft: expected one source a row (" + std::to_string(n) + "), got " +
                           std::to_string(sources.size()));
  for (int64_t r = 0; r < n; ++r) {
    if (sources[r] < 0 || sources[r] >= impl.hidden_rows)
      return InvalidArgument("MtpDraft: source " + std::to_string(sources[r]) + " of row " +
                             std::to_string(r) + " is outside the " +
                             std::to_string(impl.hidden_rows) + " rows of the last step");
  }
  if (chained < 0 || chained > kMaxMtpChain || (chained > 0 && w == 0))
    return InvalidArgument("MtpDraft: chained drafts must be in [0, " +
                           std::to_string(kMaxMtpChain) + "], and need wanted rows");
  Buffers& b = impl.buffers;
  Backend& be = *backend_;
  const int64_t dim = arch_.dim;
  // The chained rows, `w` a draft (one a wanted row), at the positions after their row's.
  const int64_t chain = chained * w;
  if (w > b.slots || chain > static_cast<int64_t>(b.slots) * kMaxMtpChain)
    return InvalidArgument("MtpDraft: more wanted rows than slots");
  std::vector<int32_t> chain_slots(chain), chain_positions(chain), chain_sources(chain);
  const int64_t capacity = static_cast<int64_t>(tables.max_pages) * kPage;
  for (int64_t j = 0; j < chained; ++j) {
    for (int64_t i = 0; i < w; ++i) {
      const int32_t row = rows.wanted[i];
      const int64_t position = rows.positions[row] + 1 + j;
      const int32_t slot = rows.slots[row];
      if (position >= capacity || tables.pages[slot * tables.max_pages + position / kPage] < 0 ||
          tables.pages[slot * tables.max_pages + position / kPage] >= impl.pages)
        return InvalidArgument("MtpDraft: chained draft " + std::to_string(j + 1) + " of row " +
                               std::to_string(row) + " at position " + std::to_string(position) +
                               " has no page");
      chain_slots[j * w + i] = slot;
      chain_positions[j * w + i] = static_cast<int32_t>(position);
      // Draft j + 1 reads the MTP layer's output at the row before: the wanted row of the first
      // run, then its own chained row.
      chain_sources[j * w + i] = static_cast<int32_t>(j == 0 ? row : i);
    }
  }
  // The rows padded to a power of two with copies of the last row (the same keys written twice
  // at its position), so that a few recorded shapes serve every count.
  Rows padded = rows;
  std::vector<int32_t> padded_sources(sources.begin(), sources.end());
  int64_t bucket = 1;
  while (bucket < n) bucket *= 2;
  if (n > 0 && bucket <= b.rows) {
    for (int64_t r = n; r < bucket; ++r) {
      padded.tokens.push_back(rows.tokens[n - 1]);
      padded.slots.push_back(rows.slots[n - 1]);
      padded.positions.push_back(rows.positions[n - 1]);
      padded.rotary.push_back(rows.rotary[n - 1]);
      padded_sources.push_back(sources[n - 1]);
    }
  }
  const int64_t m = padded.size();
  // The MTP layer attends to its own pages only: its rows need not be in a recurrent layer's
  // order.
  GZ_RETURN_IF_ERROR(UploadStepInputs(padded, tables, /*recurrent_order=*/false));
  impl.mtp_table_width = tables.max_pages;
  UploadMtpOrder(m);
  be.CopyToDevice(b.mtp_sources->data(), padded_sources.data(), m * sizeof(int32_t));
  if (chain > 0) {
    UploadMtpOrder(w, b.chain_order.get());
    be.CopyToDevice(b.chain_slots->data(), chain_slots.data(), chain * sizeof(int32_t));
    be.CopyToDevice(b.chain_positions->data(), chain_positions.data(), chain * sizeof(int32_t));
    be.CopyToDevice(b.chain_sources->data(), chain_sources.data(), chain * sizeof(int32_t));
  }
  int32_t* picks = b.mtp_picks->as<int32_t>();  // [1 + chained, w]
  // The drafts' head: over the first draft_vocab tokens where SetDraftVocab chose fewer.
  const Weight* head = impl.draft_vocab > 0 ? &impl.draft_head : nullptr;
  const int64_t vocab = impl.draft_vocab > 0 ? impl.draft_vocab : arch_.vocab;
  // The largest logit of each of the `count` rows of the logits buffer into `out`: on the
  // device where the backend picks tokens, else on the host (which records nothing).
  const bool device_picks = be.CanSample();
  auto pick = [&](int64_t count, int32_t* out) {
    if (device_picks) {
      be.Sample({out, b.logits->as<float>(), b.mtp_greedy->as<SampleRow>(), count, vocab});
      return;
    }
    std::vector<float> logits(count * vocab);
    be.CopyToHost(logits.data(), b.logits->data(), logits.size() * sizeof(float));
    be.Synchronize();
    std::vector<int32_t> host(count);
    for (int64_t r = 0; r < count; ++r) {
      const float* row = logits.data() + r * vocab;
      host[r] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
    }
    be.CopyToDevice(out, host.data(), count * sizeof(int32_t));
  };
  // As Forward's: the ops depend only on the buffers, the row, wanted and chained counts and the
  // table width.
  const bool record = device_picks && m < (1 << 16) && w < (1 << 12) && chained < 16 &&
                      tables.max_pages < (1 << 12);
  const uint64_t key = uint64_t{1} << 63 | (impl.step_generation % (1 << 18)) << 44 |
                       static_cast<uint64_t>(tables.max_pages) << 32 |
                       static_cast<uint64_t>(chained) << 28 | static_cast<uint64_t>(w) << 16 |
                       static_cast<uint64_t>(m);
  const bool replayed = record && be.ReplayStep(key);
  bool recording = false;
  if (record && !replayed) {
    if (impl.seen_once.size() >= kMaxSeenOnce) impl.seen_once.clear();
    recording = !impl.seen_once.insert(key).second;
    if (recording) {
      impl.seen_once.erase(key);
      be.BeginStep(key);
    }
  }
  if (!replayed) {
    float* state = b.mtp_in->as<float>() + m * dim;
    be.GatherRows({state, b.final_hidden->as<float>(), b.mtp_sources->as<int32_t>(), m, dim});
    IssueMtpLayer(m, b.mtp_normed->as<float>());
    if (w > 0) {
      IssueMtpHead(b.mtp_normed->as<float>(), w, nullptr, head);
      pick(w, picks);
    }
    if (chain > 0) {
      // Each chained run reads the drafts just picked, at the next positions.
      StepInputs in = b.Inputs(w, tables.max_pages, /*mrope=*/false);
      for (int64_t j = 0; j < chained; ++j) {
        int32_t* chain_tokens = b.chain_tokens->as<int32_t>() + j * w;
        be.CopyOnDevice(chain_tokens, picks + j * w, w * sizeof(int32_t));
        in.slots = b.chain_slots->as<int32_t>() + j * w;
        in.positions = b.chain_positions->as<int32_t>() + j * w;
        in.rotary = in.positions;
        be.GatherRows({b.mtp_in->as<float>() + w * dim, b.mtp_normed->as<float>(),
                       b.chain_sources->as<int32_t>() + j * w, w, dim});
        IssueMtpLayer(w, b.mtp_normed->as<float>(), chain_tokens, &in,
                      b.chain_order->as<int32_t>());
        IssueMtpHead(b.mtp_normed->as<float>(), w, b.iota->as<int32_t>(), head);
        pick(w, picks + (j + 1) * w);
      }
    }
  }
  if (recording) be.EndStep();
  if (w > 0) {
    // [1 + chained, w] into [w, 1 + chained].
    std::vector<int32_t> host((1 + chained) * w);
    be.CopyToHost(host.data(), picks, host.size() * sizeof(int32_t));
    be.Synchronize();
    for (int64_t j = 0; j <= chained; ++j) {
      for (int64_t i = 0; i < w; ++i) tokens[i * (1 + chained) + j] = host[j * w + i];
    }
  }
  be.Synchronize();
  return Status::Ok();
}

Status Model::Forward(const Rows& rows, const PageTables& tables,
                      std::span<const int> hidden_layers, float* hidden_out, float* logits,
                      std::span<const SampleRow> sample, const SampleMasks* masks,
                      int32_t* tokens) {
  GZ_RETURN_IF_ERROR(UploadStepInputs(rows, tables));
  const Arch& a = arch_;
  Impl& impl = *impl_;
  Buffers& b = impl.buffers;
  Backend& be = *backend_;
  const int64_t n = rows.size();
  // A pipeline stage: the stage before it gave its rows' residual stream (uploaded outside a
  // recorded step, as the other inputs); the last stage alone reads the head.
  const bool first = impl.first_layer == 0;
  const bool last = impl.end_layer == a.layers;
  if (!first) {
    if (!impl.stage_in) return InvalidArgument("Step: a pipeline stage without its input rows");
    be.CopyToDevice(b.x->data(), impl.stage_in, n * a.dim * sizeof(float));
  }
  if (!last && !impl.stage_out)
    return InvalidArgument("Step: a pipeline stage without a place for its output rows");
  if (!last) logits = nullptr, tokens = nullptr;
  if (tokens && !rows.wanted.empty()) {
    be.CopyToDevice(b.sample->data(), sample.data(), sample.size() * sizeof(SampleRow));
  }
  StepBuilder step(be, b.x->as<float>(), b.h->as<float>(), b.o->as<float>(), n, a.dim,
                   static_cast<float>(a.norm_eps));
  const StepInputs in = b.Inputs(n, tables.max_pages, !rows.rotary_h.empty());
  if (impl.keeps_row_inputs) {
    // Which rows each slot read in this step, and whether its draft snapshot came before it.
    std::fill(impl.step_count.begin(), impl.step_count.end(), 0);
    for (int64_t r = 0; r < n; ++r) {
      if (impl.step_count[rows.slots[r]]++ == 0) {
        impl.step_first[rows.slots[r]] = r;
        impl.step_first_position[rows.slots[r]] = rows.positions[r];
      }
    }
    impl.step_one_slot = n > 0 && impl.step_count[rows.slots[0]] == n;
    impl.snapshot_valid = impl.snapshot_pending;
    std::fill(impl.snapshot_pending.begin(), impl.snapshot_pending.end(), 0);
  }
  // The step's picture rows as runs of rows adjacent both in the step and where they are read:
  // each run's embeddings at `embed` ([count, dim]), its deepstack feature l at deep + l * plane.
  struct Run {
    int64_t row, count;
    const float* embed;
    const float* deep;
    int64_t plane;
    int layers;
  };
  std::vector<Run> runs;
  const VisualRows& visual = rows.visual;
  for (int64_t j = 0; j < visual.size(); ++j) {
    Run next;
    if (visual.sources.empty()) {
      next = {visual.rows[j],
              1,
              b.visual->as<float>() + j * a.dim,
              visual.layers > 0 ? b.deepstack->as<float>() + j * a.dim : nullptr,
              visual.size() * a.dim,
              visual.layers};
    } else {
      const VisualRows::Source& src = visual.sources[j];
      next = {visual.rows[j], 1, src.row, src.row + src.plane, src.plane, src.layers};
    }
    Run* last = runs.empty() ? nullptr : &runs.back();
    if (last && last->row + last->count == next.row &&
        last->embed + last->count * a.dim == next.embed && last->plane == next.plane &&
        last->layers == next.layers) {
      ++last->count;
    } else {
      runs.push_back(next);
    }
  }
  auto capture = [&](int layer) {
    for (size_t i = 0; i < hidden_layers.size(); ++i) {
      if (hidden_layers[i] != layer) continue;
      be.CopyToHost(hidden_out + i * n * a.dim, step.Current(), n * a.dim * sizeof(float));
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
  const bool record = hidden_layers.empty() && visual.empty() && rows.rotary_h.empty() &&
                      n < (1 << 16) && wanted_rows < (1 << 16) && tables.max_pages < (1 << 12);
  // Bits 62 and 63 stay clear: MtpDraft's keys set them.
  const uint64_t key = (impl.step_generation % (1 << 18)) << 44 |
                       static_cast<uint64_t>(tables.max_pages) << 32 | wanted_rows << 16 |
                       static_cast<uint64_t>(n);
  const bool replayed = record && be.ReplayStep(key);
  bool recording = false;
  if (record && !replayed) {
    if (impl.seen_once.size() >= kMaxSeenOnce) impl.seen_once.clear();
    recording = !impl.seen_once.insert(key).second;
    if (recording) {
      impl.seen_once.erase(key);
      be.BeginStep(key);
    }
  }
  if (!replayed && first)
    be.Embed({b.x->as<float>(), &impl.embed, b.tokens->as<int32_t>(), n, a.embed_scale});
  // Picture rows read the tower's rows instead of their placeholder's embedding (a copy of
  // each run of rows through GatherRows with the identity index).
  for (const Run& run : runs) {
    if (!first) break;
    be.GatherRows({b.x->as<float>() + run.row * a.dim, run.embed, b.iota->as<int32_t>(),
                   run.count, a.dim});
  }
  capture(impl.first_layer);
  for (int l = impl.first_layer; !replayed && l < impl.end_layer; ++l) {
    const Layer& L = impl.layers[l - impl.first_layer];
    if (L.is_recurrent) {
      L.recurrent.Issue(step, in);
    } else if (L.table == 0) {
      L.attention.Issue(step, in);
    } else {
      StepInputs window_in = in;
      window_in.table.pages =
          b.pages->as<int32_t>() + L.table * static_cast<int64_t>(b.slots) * b.max_pages;
      L.attention.Issue(step, window_in);
    }
    if (L.is_moe) {
      L.moe.Issue(step, in);
    } else {
      L.feed_forward.Issue(step, in);
    }
    capture(l + 1);
    if (l < visual.layers) {
      // Deepstack: layer l's feature joins the picture rows' residual stream after the layer.
      float* x = step.Current();
      for (const Run& run : runs) {
        if (l >= run.layers) continue;
        be.Add({x + run.row * a.dim, run.deep + l * run.plane, run.count * a.dim});
      }
    }
  }
  if (!last) {
    // The residual stream whole in x, for the next stage.
    if (!replayed) step.Current();
    if (recording) be.EndStep();
    be.CopyToHost(impl.stage_out, b.x->data(), n * a.dim * sizeof(float));
    be.Synchronize();
    return Status::Ok();
  }
  // layers + 1: the last layer's output after the final norm (transformers' last_hidden_state,
  // what an embedder pools), normalized into h by an op of its own.
  if (std::find(hidden_layers.begin(), hidden_layers.end(), a.layers + 1) != hidden_layers.end()) {
    float* normed = b.h->as<float>();
    be.RmsNorm({normed, step.Current(), nullptr, impl.final_norm, n, a.dim, step.eps()});
    for (size_t i = 0; i < hidden_layers.size(); ++i) {
      if (hidden_layers[i] != a.layers + 1) continue;
      be.CopyToHost(hidden_out + i * n * a.dim, normed, n * a.dim * sizeof(float));
    }
  }
  // Every row's final-normed hidden state stays on the device for MtpDraft.
  if (!replayed && impl.keeps_hidden) {
    be.RmsNorm({b.final_hidden->as<float>(), step.Current(), nullptr, impl.final_norm, n, a.dim,
                step.eps()});
  }
  if (impl.keeps_hidden) impl.hidden_rows = n;
  if (!replayed && head_wanted) {
    const int64_t w = static_cast<int64_t>(rows.wanted.size());
    float* out = logits_in_place ? logits : b.logits->as<float>();
    if (be.FusesMatmul() && !step.pending()) {
      // The norm is per row: the wanted rows of x, normalized inside the head's matmul.
      impl.IssueHead(be, a, step.Current(), w, impl.final_norm, step.eps(), out);
    } else {
      MatmulParams normed;
      step.Normed(impl.final_norm, &normed);
      impl.IssueHead(be, a, normed.x, w, /*norm=*/nullptr, step.eps(), out);
    }
  }
  if (recording) be.EndStep();
  if (logits && !rows.wanted.empty() && !logits_in_place) {
    be.CopyToHost(logits, b.logits->data(), rows.wanted.size() * a.vocab * sizeof(float));
  }
  if (tokens && !rows.wanted.empty()) {
    // Outside the recorded step: the parameters change every step (uploaded above), and the
    // masks are taken only now, once the layers are issued, so that they are computed while the
    // layers run.
    SampleParams p{b.picks->as<int32_t>(), b.logits->as<float>(), b.sample->as<SampleRow>(),
                   static_cast<int64_t>(rows.wanted.size()), a.vocab};
    int64_t masked = 0;
    for (const SampleRow& row : sample) masked = std::max<int64_t>(masked, row.mask + 1);
    if (masked > 0) {
      const int64_t words = masked * MaskWords(a.vocab);
      if (!masks || !*masks) return InvalidArgument("StepSample: rows with a mask, but no masks");
      const std::span<const uint64_t> allowed = (*masks)();
      if (static_cast<int64_t>(allowed.size()) < words) {
        return InvalidArgument("StepSample: expected " + std::to_string(masked) + " masks of " +
                               std::to_string(MaskWords(a.vocab)) + " words, got " +
                               std::to_string(allowed.size()) + " words");
      }
      if (words > b.mask_words) {
        b.masks.reset();
        GZ_ASSIGN_OR_RETURN(b.masks, be.Allocate(words * sizeof(uint64_t)));
        b.mask_words = words;
      }
      be.CopyToDevice(b.masks->data(), allowed.data(), words * sizeof(uint64_t));
      p.masks = b.masks->as<uint64_t>();
    }
    be.Sample(p);
    be.CopyToHost(tokens, b.picks->data(), rows.wanted.size() * sizeof(int32_t));
  }
  be.Synchronize();
  return Status::Ok();
}

Status Model::SaveSlotState(int32_t slot) {
  Buffers& b = impl_->buffers;
  if (!b.states) return Status::Ok();  // no recurrent layers
  return CopySlotState(slot, b.states->as<float>(), b.saved->as<float>(), "SaveSlotState");
}

Status Model::RestoreSlotState(int32_t slot) {
  Buffers& b = impl_->buffers;
  if (!b.states) return Status::Ok();
  return CopySlotState(slot, b.saved->as<float>(), b.states->as<float>(), "RestoreSlotState");
}

Status Model::ReserveDrafts() {
  if (!HasSlotStates(caches_) || impl_->keeps_row_inputs) return Status::Ok();
  impl_->keeps_row_inputs = true;
  Buffers& b = impl_->buffers;
  if (b.rows == 0) return Status::Ok();  // Reserve allocates them
  // Reallocated at the sizes reserved so far (Reserve returns early when nothing grows).
  const int64_t rows = b.rows;
  b.rows = 0;
  return Reserve(rows, b.slots, b.max_pages);
}

Status Model::SnapshotDraftState(int32_t slot) {
  const int32_t slots[] = {slot};
  return SnapshotDraftStates(slots);
}

Status Model::KeepDraftRows(int32_t slot, int64_t rows) {
  const KeptDraftRows kept[] = {{slot, rows}};
  return KeepDraftRowsOf(kept);
}

namespace {

// Keys of the draft states' copies and replays of one slot (Model::SnapshotDraftStates,
// KeepDraftRowsOf), recorded and replayed as a step's ops are: bit 62 (bit 63 is MtpDraft's, a
// step's keys leave both clear), the buffers' generation, then what the ops depend on.
uint64_t DraftStateKey(uint64_t generation, bool keep, int32_t slot, int64_t first, int64_t rows) {
  return uint64_t{1} << 62 | (generation % (1 << 18)) << 44 | static_cast<uint64_t>(keep) << 43 |
         static_cast<uint64_t>(slot) << 28 | static_cast<uint64_t>(first) << 12 |
         static_cast<uint64_t>(rows);
}

bool DraftStateKeyFits(int32_t slot, int64_t first, int64_t rows) {
  return slot < (1 << 15) && first < (1 << 16) && rows < (1 << 12);
}

// Issues `ops` under `key`: replayed where recorded, recorded the second time the key comes.
void IssueRecorded(Backend& be, std::unordered_set<uint64_t>& seen_once, uint64_t key,
                   const std::function<void()>& ops) {
  if (be.ReplayStep(key)) return;
  if (seen_once.size() >= kMaxSeenOnce) seen_once.clear();
  const bool recording = !seen_once.insert(key).second;
  if (recording) {
    seen_once.erase(key);
    be.BeginStep(key);
  }
  ops();
  if (recording) be.EndStep();
}

}  // namespace

void Model::CopySlotRuns(std::span<const int32_t> slots, float* from, float* to) {
  for (size_t i = 0; i < slots.size();) {
    size_t j = i + 1;
    while (j < slots.size() && slots[j] == slots[j - 1] + 1) ++j;
    const int64_t count = static_cast<int64_t>(j - i);
    // In range (checked by the callers): the parts cannot fail.
    (void)ForEachSlotStatePart(slots[i], "CopySlotRuns", [&](int64_t at, int64_t floats) {
      backend_->CopyOnDevice(to + at, from + at, floats * count * sizeof(float));
    });
    i = j;
  }
}

Status Model::SnapshotDraftStates(std::span<const int32_t> slots) {
  Impl& impl = *impl_;
  Buffers& b = impl.buffers;
  if (!b.states || slots.empty()) return Status::Ok();
  if (!impl.keeps_row_inputs)
    return InvalidArgument("SnapshotDraftState: ReserveDrafts was not called");
  std::vector<int32_t> sorted(slots.begin(), slots.end());
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= b.slots)
      return InvalidArgument("SnapshotDraftState: slot " + std::to_string(sorted[i]) +
                             " out of range");
    if (i > 0 && sorted[i] == sorted[i - 1])
      return InvalidArgument("SnapshotDraftState: slot " + std::to_string(sorted[i]) +
                             " listed twice");
  }
  float* live = b.states->as<float>();
  float* saved = b.draft_saved->as<float>();
  if (sorted.size() == 1 && impl.step_one_slot && DraftStateKeyFits(sorted[0], 0, 0)) {
    // One slot (one sequence drafting, alone in the step before: most likely alone in the
    // next too): its copies as one recorded launch.
    IssueRecorded(*backend_, impl.seen_once,
                  DraftStateKey(impl.step_generation, false, sorted[0], 0, 0),
                  [&] { CopySlotRuns(sorted, live, saved); });
  } else {
    CopySlotRuns(sorted, live, saved);
  }
  for (int32_t slot : sorted) impl.snapshot_pending[slot] = 1;
  return Status::Ok();
}

// Why the snapshot and a replay rather than a snapshot a row: a slot's states (tens of MB on a
// large model) are copied once a step, and only the kept rows' updates run again.
Status Model::KeepDraftRowsOf(std::span<const KeptDraftRows> kept) {
  Impl& impl = *impl_;
  Buffers& b = impl.buffers;
  if (!b.states) return Status::Ok();
  std::vector<KeptDraftRows> back;  // the slots whose states go back, by slot
  for (const KeptDraftRows& k : kept) {
    if (k.slot < 0 || k.slot >= b.slots)
      return InvalidArgument("KeepDraftRows: slot " + std::to_string(k.slot) + " out of range");
    const int64_t count = impl.keeps_row_inputs ? impl.step_count[k.slot] : 0;
    if (k.rows < 0 || k.rows > count)
      return InvalidArgument("KeepDraftRows: " + std::to_string(k.rows) + " rows of the " +
                             std::to_string(count) + " slot " + std::to_string(k.slot) +
                             " read in the last step");
    if (k.rows == count) continue;
    if (!impl.snapshot_valid[k.slot])
      return InvalidArgument("KeepDraftRows: no draft snapshot of slot " + std::to_string(k.slot) +
                             " was taken before the last step");
    back.push_back(k);
  }
  std::sort(back.begin(), back.end(),
            [](const KeptDraftRows& x, const KeptDraftRows& y) { return x.slot < y.slot; });
  for (size_t i = 1; i < back.size(); ++i) {
    if (back[i].slot == back[i - 1].slot)
      return InvalidArgument("KeepDraftRows: slot " + std::to_string(back[i].slot) +
                             " listed twice");
  }
  if (back.empty()) return Status::Ok();
  for (const KeptDraftRows& k : back) impl.snapshot_valid[k.slot] = 0;  // read once
  float* live = b.states->as<float>();
  float* saved = b.draft_saved->as<float>();
  // The step's slots and positions are still in their buffers (UploadStepInputs).
  StepInputs in;
  in.slots = b.slot_of->as<int32_t>();
  in.positions = b.positions->as<int32_t>();
  in.mix = b.mix->as<float>();
  in.attn = b.attn->as<float>();
  in.b = b.b->as<float>();
  in.a = b.a->as<float>();
  in.iota = b.iota->as<int32_t>();
  if (back.size() == 1) {
    // One slot: the snapshot back and the replay of its kept rows as one recorded launch (in
    // order with the next step's ops on the backend: nothing to wait for here).
    const KeptDraftRows& k = back[0];
    const int32_t slots[] = {k.slot};
    const int64_t first = impl.step_first[k.slot];
    auto ops = [&] {
      CopySlotRuns(slots, saved, live);
      for (const Layer& layer : impl.layers) {
        if (layer.is_recurrent && k.rows > 0) layer.recurrent.Replay(*backend_, in, first, k.rows);
      }
    };
    if (impl.step_one_slot && DraftStateKeyFits(k.slot, first, k.rows)) {
      IssueRecorded(*backend_, impl.seen_once,
                    DraftStateKey(impl.step_generation, true, k.slot, first, k.rows), ops);
    } else {
      ops();
    }
    return Status::Ok();
  }
  // Many slots: the snapshots back by runs of adjacent slots, then every slot's kept rows
  // (each slot's in order, as the step read them) replayed together.
  std::vector<int32_t> slots;
  for (const KeptDraftRows& k : back) slots.push_back(k.slot);
  CopySlotRuns(slots, saved, live);
  std::vector<int32_t> index, of, positions;
  for (const KeptDraftRows& k : back) {
    for (int64_t i = 0; i < k.rows; ++i) {
      index.push_back(static_cast<int32_t>(impl.step_first[k.slot] + i));
      of.push_back(k.slot);
      positions.push_back(impl.step_first_position[k.slot] + static_cast<int32_t>(i));
    }
  }
  const int64_t n = static_cast<int64_t>(index.size());
  if (n == 0) return Status::Ok();
  index.insert(index.end(), of.begin(), of.end());
  index.insert(index.end(), positions.begin(), positions.end());
  int32_t* device = b.replay_rows->as<int32_t>();
  backend_->CopyToDevice(device, index.data(), index.size() * sizeof(int32_t));
  for (const Layer& layer : impl.layers) {
    if (layer.is_recurrent)
      layer.recurrent.ReplayRows(*backend_, in, device, device + n, device + 2 * n, n);
  }
  return Status::Ok();
}

Status Model::ForEachSlotStatePart(int32_t slot, const char* who,
                                   const std::function<void(int64_t at, int64_t floats)>& part) {
  Buffers& b = impl_->buffers;
  if (slot < 0 || slot >= b.slots)
    return InvalidArgument(std::string(who) + ": slot " + std::to_string(slot) + " out of range");
  const float* live = b.states->as<float>();
  for (const Layer& layer : impl_->layers) {
    if (!layer.is_recurrent) continue;
    const RecurrentSpec& r = layer.recurrent.spec();
    const int64_t conv = static_cast<int64_t>(r.kernel - 1) * r.ConvDim();
    const int64_t delta = static_cast<int64_t>(r.v_heads) * r.k_dim * r.v_dim;
    part((layer.recurrent.conv_states - live) + slot * conv, conv);
    part((layer.recurrent.delta_states - live) + slot * delta, delta);
  }
  return Status::Ok();
}

Status Model::CopySlotState(int32_t slot, float* from, float* to, const char* who) {
  // Copied in order with the backend's ops (the next step sees them), so nothing waits here.
  return ForEachSlotStatePart(slot, who, [&](int64_t at, int64_t floats) {
    backend_->CopyOnDevice(to + at, from + at, floats * sizeof(float));
  });
}

int64_t Model::SlotStatesBytes() const {
  int64_t bytes = 0;
  for (const CacheSpec& c : caches_) bytes += c.SlotStateBytes();
  return bytes;
}

Status Model::CopySlotStatesToHost(int32_t slot, bool saved, void* host) {
  Buffers& b = impl_->buffers;
  if (!b.states) return Status::Ok();
  return CopySlotStatesHost(slot, (saved ? b.saved : b.states)->as<float>(),
                            static_cast<uint8_t*>(host), true, "CopySlotStatesToHost");
}

Status Model::CopySlotStatesFromHost(int32_t slot, const void* host) {
  Buffers& b = impl_->buffers;
  if (!b.states) return Status::Ok();
  return CopySlotStatesHost(slot, b.states->as<float>(),
                            static_cast<uint8_t*>(const_cast<void*>(host)), false,
                            "CopySlotStatesFromHost");
}

Status Model::CopySlotStatesHost(int32_t slot, float* buffer, uint8_t* host, bool to_host,
                                 const char* who) {
  GZ_RETURN_IF_ERROR(ForEachSlotStatePart(slot, who, [&](int64_t at, int64_t floats) {
    const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
    if (to_host) {
      backend_->CopyToHost(host, buffer + at, bytes);
    } else {
      backend_->CopyToDevice(buffer + at, host, bytes);
    }
    host += bytes;
  }));
  backend_->Synchronize();
  return Status::Ok();
}

Status Model::CopyPageToHost(int32_t page, void* host) { return CopyPage(page, host, true); }

Status Model::CopyPageFromHost(int32_t page, const void* host) {
  return CopyPage(page, const_cast<void*>(host), false);
}

// A page's bytes on the host: region by region, its keys, values and (q8, rotated) key and value
// scales.
Status Model::CopyPage(int32_t page, void* host, bool to_host) {
  if (page < 0 || page >= impl_->pages)
    return InvalidArgument(std::string(to_host ? "CopyPageToHost" : "CopyPageFromHost") +
                           ": bad page");
  auto* h = static_cast<uint8_t*>(host);
  auto copy = [&](void* base, int64_t bytes) {
    uint8_t* device = static_cast<uint8_t*>(base) + page * bytes;
    if (to_host) {
      backend_->CopyToHost(h, device, bytes);
    } else {
      backend_->CopyToDevice(device, h, bytes);
    }
    h += bytes;
  };
  for (const Impl::Region& region : impl_->regions) {
    copy(region.kv.keys, region.key_bytes);
    copy(region.kv.values, region.value_bytes);
    if (region.scale_bytes > 0) {
      copy(region.kv.key_scales, region.scale_bytes);
      copy(region.kv.value_scales, region.scale_bytes);
    }
  }
  backend_->Synchronize();
  return Status::Ok();
}

}  // namespace gizllm
