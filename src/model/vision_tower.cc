#include "model/vision_tower.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "core/mapped_file.h"
#include "core/thread_pool.h"
#include "formats/safetensors.h"

namespace gizllm {
namespace {

// Runs of at least this many patches compute their position rows on several threads.
constexpr int64_t kParallelPatches = 1024;

// A linear with its bias on the device.
struct Linear {
  Weight w;
  const float* bias = nullptr;  // [outputs]

  void Issue(Backend& be, const float* x, int64_t rows, float* out) const {
    MatmulParams m;
    m.x = x;
    m.rows = rows;
    m.w[0] = &w;
    m.bias[0] = bias;
    m.out[0] = out;
    be.Matmul(m);
  }
};

struct Norm {
  const float* weight = nullptr;  // [dim]
  const float* bias = nullptr;    // [dim]
};

// One block: LayerNorms with bias, q/k/v (each head's q and k rows reordered: height pairs,
// then width pairs), the output projection, the MLP.
struct Block {
  Norm norm1, norm2;
  Weight q, k, v;
  const float* q_bias = nullptr;
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  Linear proj, fc1, fc2;
};

// A merger: the norm (over one patch's hidden state, or over a merged row's for the deepstack
// mergers), fc1, GELU, fc2.
struct Merger {
  Norm norm;
  bool norm_merged = false;
  Linear fc1, fc2;
};

// torch.linspace(0, end, steps) in float32, as its CPU kernel computes it: the first half
// from the start, the second half back from the end.
std::vector<float> Linspace(float end, int64_t steps) {
  std::vector<float> v(steps, 0.0f);
  if (steps == 1) return v;
  const float step = end / static_cast<float>(steps - 1);
  const int64_t half = steps / 2;
  for (int64_t i = 0; i < steps; ++i) {
    v[i] = i < half ? step * static_cast<float>(i) : end - step * static_cast<float>(steps - i - 1);
  }
  return v;
}

}  // namespace

int64_t VisionTokens(const VisionArch& arch, const VisionGrid& grid) {
  return grid.t * (grid.h / arch.merge) * (grid.w / arch.merge);
}

PositionTaps VisionPositionTaps(const VisionArch& arch, std::span<const VisionGrid> grids) {
  PositionTaps taps;
  const int side = arch.grid_side;
  const int m = arch.merge;
  for (const VisionGrid& g : grids) {
    const std::vector<float> hs = Linspace(static_cast<float>(side - 1), g.h);
    const std::vector<float> ws = Linspace(static_cast<float>(side - 1), g.w);
    // Frames repeat the picture's taps; windows of m x m patches come row by row.
    for (int64_t t = 0; t < g.t; ++t) {
      for (int64_t bh = 0; bh < g.h / m; ++bh) {
        for (int64_t bw = 0; bw < g.w / m; ++bw) {
          for (int ih = 0; ih < m; ++ih) {
            for (int iw = 0; iw < m; ++iw) {
              const float y = hs[bh * m + ih], x = ws[bw * m + iw];
              const int32_t y0 = static_cast<int32_t>(y), x0 = static_cast<int32_t>(x);
              const int32_t y1 = std::min(y0 + 1, side - 1), x1 = std::min(x0 + 1, side - 1);
              const float dy = y - static_cast<float>(y0), dx = x - static_cast<float>(x0);
              taps.index.insert(taps.index.end(),
                                {y0 * side + x0, y0 * side + x1, y1 * side + x0, y1 * side + x1});
              taps.weight.insert(taps.weight.end(),
                                 {(1 - dy) * (1 - dx), (1 - dy) * dx, dy * (1 - dx), dy * dx});
            }
          }
        }
      }
    }
  }
  return taps;
}

std::vector<int32_t> VisionRotaryPositions(const VisionArch& arch,
                                           std::span<const VisionGrid> grids) {
  std::vector<int32_t> pos;
  const int m = arch.merge;
  for (const VisionGrid& g : grids) {
    for (int64_t t = 0; t < g.t; ++t) {
      for (int64_t bh = 0; bh < g.h / m; ++bh) {
        for (int64_t bw = 0; bw < g.w / m; ++bw) {
          for (int ih = 0; ih < m; ++ih) {
            for (int iw = 0; iw < m; ++iw) {
              pos.push_back(static_cast<int32_t>(bh * m + ih));
              pos.push_back(static_cast<int32_t>(bw * m + iw));
            }
          }
        }
      }
    }
  }
  return pos;
}

struct VisionTower::Impl {
  Checkpoint checkpoint;
  PlacedWeights placed;
  Linear patch_embed;
  std::vector<float> pos_table;     // [positions, dim], host
  const float* inv_freq = nullptr;  // [head_dim / 4]
  std::vector<Block> blocks;
  Merger merger;
  std::vector<Merger> deepstack;
  // Device buffers, grown to the largest run seen.
  std::vector<std::unique_ptr<Buffer>> storage;
  int64_t patch_capacity = 0;
  int frame_capacity = 0;
  float* pixels = nullptr;    // [patches, patch floats]
  float* x = nullptr;         // [patches, dim]
  float* h = nullptr;         // [patches, dim]
  float* q = nullptr;         // [patches, dim]
  float* k = nullptr;         // [patches, dim]
  float* v = nullptr;         // [patches, dim]
  float* attn = nullptr;      // [patches, dim]
  float* ff = nullptr;        // [patches, max(ffn, dim)]
  float* ones = nullptr;      // [patches, ffn]: the up half of a GeGLU that is a plain GELU
  float* merged = nullptr;    // [patches / merge^2, merge^2 * dim]
  float* merged2 = nullptr;   // [patches / merge^2, merge^2 * dim]
  float* out = nullptr;       // [patches / merge^2, out_dim]
  int32_t* rotary = nullptr;  // [patches, heads, 2]
  int32_t* starts = nullptr;  // [frames + 1]
  std::unique_ptr<ThreadPool> threads;  // for the position rows of large runs
};

VisionTower::~VisionTower() = default;

int64_t VisionTower::Parameters() const { return impl_->placed.parameters; }

Expected<std::unique_ptr<VisionTower>> VisionTower::Load(const std::string& dir,
                                                         std::shared_ptr<Backend> backend) {
  GZ_ASSIGN_OR_RETURN(VisionArch arch, ReadVisionArch(dir));
  if (!backend->SupportsEncoder()) {
    return Unimplemented(dir + ": a vision tower runs on the encoder ops, which " +
                         backend->Describe() + " does not have");
  }
  if (Status s = backend->CheckEncoderShape(arch.head_dim); !s.ok()) {
    return Unimplemented(dir + "/config.json: vision_config: " + s.message());
  }
  std::unique_ptr<VisionTower> tower(new VisionTower());
  tower->arch_ = arch;
  tower->backend_ = std::move(backend);
  tower->impl_ = std::make_unique<Impl>();
  Impl& impl = *tower->impl_;
  // A converted folder keeps the tower in a file of its own.
  const std::string tower_file = dir + "/" + kVisionTowerFile;
  GZ_ASSIGN_OR_RETURN(impl.checkpoint, Checkpoint::Open(FileExists(tower_file) ? tower_file : dir));
  const VisionArch& a = tower->arch_;
  Arch names;  // the loader's role names are not used: the tower loads by name
  names.family = a.family;
  WeightLoader w(impl.checkpoint, names, *tower->backend_, dir, &impl.placed);
  const std::string& p = a.prefix;
  auto linear = [&](const std::string& name, int64_t outputs, int64_t inputs,
                    Linear* out) -> Status {
    GZ_ASSIGN_OR_RETURN(out->w, w.NamedMatrix(name + ".weight", outputs, inputs));
    GZ_ASSIGN_OR_RETURN(out->bias, w.NamedVector(name + ".bias", outputs));
    return Status::Ok();
  };
  auto norm = [&](const std::string& name, int64_t n, Norm* out) -> Status {
    GZ_ASSIGN_OR_RETURN(out->weight, w.NamedVector(name + ".weight", n));
    GZ_ASSIGN_OR_RETURN(out->bias, w.NamedVector(name + ".bias", n));
    return Status::Ok();
  };
  {
    const int64_t shape[] = {a.dim, a.channels, a.temporal_patch, a.patch, a.patch};
    const WeightLoader::Rows all[] = {{0, a.dim}};
    GZ_ASSIGN_OR_RETURN(impl.patch_embed.w,
                        w.NamedMatrixRows(p + "patch_embed.proj.weight", shape, all, "patches"));
    GZ_ASSIGN_OR_RETURN(impl.patch_embed.bias, w.NamedVector(p + "patch_embed.proj.bias", a.dim));
  }
  {
    const int64_t shape[] = {a.positions, a.dim};
    GZ_ASSIGN_OR_RETURN(impl.pos_table, w.NamedHost(p + "pos_embed.weight", shape));
  }
  // Qwen3VLVisionRotaryEmbedding(head_dim / 2): head_dim / 4 frequencies.
  Rope rope;
  rope.theta = a.rope_theta;
  rope.rotary_dims = a.head_dim / 2;
  GZ_ASSIGN_OR_RETURN(impl.inv_freq, w.Upload(rope.InvFreq()));

  // A head's dims in the rotation's order: its height pairs (dims [0, d/4) and [d/2, 3d/4)),
  // then its width pairs ([d/4, d/2) and [3d/4, d)).
  const int64_t d = a.head_dim, quarter = d / 4;
  std::vector<int64_t> order;
  for (int64_t first : {int64_t{0}, 2 * quarter, quarter, 3 * quarter}) {
    for (int64_t i = 0; i < quarter; ++i) order.push_back(first + i);
  }
  auto head_rows = [&](int64_t base) {
    std::vector<WeightLoader::Rows> rows;
    for (int hd = 0; hd < a.heads; ++hd) {
      for (int64_t first : {int64_t{0}, 2 * quarter, quarter, 3 * quarter})
        rows.push_back({base + hd * d + first, quarter});
    }
    return rows;
  };
  impl.blocks.resize(a.depth);
  for (int l = 0; l < a.depth; ++l) {
    Block& b = impl.blocks[l];
    const std::string n = p + "blocks." + std::to_string(l) + ".";
    GZ_RETURN_IF_ERROR(norm(n + "norm1", a.dim, &b.norm1));
    GZ_RETURN_IF_ERROR(norm(n + "norm2", a.dim, &b.norm2));
    const int64_t qkv_shape[] = {3 * a.dim, a.dim};
    const std::vector<WeightLoader::Rows> q_rows = head_rows(0), k_rows = head_rows(a.dim);
    const WeightLoader::Rows v_rows[] = {{2 * a.dim, a.dim}};
    GZ_ASSIGN_OR_RETURN(b.q, w.NamedMatrixRows(n + "attn.qkv.weight", qkv_shape, q_rows, "q"));
    GZ_ASSIGN_OR_RETURN(b.k, w.NamedMatrixRows(n + "attn.qkv.weight", qkv_shape, k_rows, "k"));
    GZ_ASSIGN_OR_RETURN(b.v, w.NamedMatrixRows(n + "attn.qkv.weight", qkv_shape, v_rows, "v"));
    const int64_t bias_shape[] = {3 * a.dim};
    GZ_ASSIGN_OR_RETURN(std::vector<float> bias, w.NamedHost(n + "attn.qkv.bias", bias_shape));
    std::vector<float> q_bias(a.dim), k_bias(a.dim);
    for (int hd = 0; hd < a.heads; ++hd) {
      for (int64_t i = 0; i < d; ++i) {
        q_bias[hd * d + i] = bias[hd * d + order[i]];
        k_bias[hd * d + i] = bias[a.dim + hd * d + order[i]];
      }
    }
    GZ_ASSIGN_OR_RETURN(b.q_bias, w.Upload(q_bias));
    GZ_ASSIGN_OR_RETURN(b.k_bias, w.Upload(k_bias));
    GZ_ASSIGN_OR_RETURN(b.v_bias,
                        w.Upload(std::vector<float>(bias.begin() + 2 * a.dim, bias.end())));
    GZ_RETURN_IF_ERROR(linear(n + "attn.proj", a.dim, a.dim, &b.proj));
    GZ_RETURN_IF_ERROR(linear(n + "mlp.linear_fc1", a.ffn, a.dim, &b.fc1));
    GZ_RETURN_IF_ERROR(linear(n + "mlp.linear_fc2", a.dim, a.ffn, &b.fc2));
  }
  auto merger = [&](const std::string& n, bool norm_merged, Merger* m) -> Status {
    m->norm_merged = norm_merged;
    GZ_RETURN_IF_ERROR(norm(n + "norm", norm_merged ? a.MergedDim() : a.dim, &m->norm));
    GZ_RETURN_IF_ERROR(linear(n + "linear_fc1", a.MergedDim(), a.MergedDim(), &m->fc1));
    return linear(n + "linear_fc2", a.out_dim, a.MergedDim(), &m->fc2);
  };
  GZ_RETURN_IF_ERROR(merger(p + "merger.", /*norm_merged=*/false, &impl.merger));
  impl.deepstack.resize(a.deepstack.size());
  for (size_t i = 0; i < a.deepstack.size(); ++i) {
    GZ_RETURN_IF_ERROR(merger(p + "deepstack_merger_list." + std::to_string(i) + ".",
                              /*norm_merged=*/true, &impl.deepstack[i]));
  }
  return tower;
}

Status VisionTower::Reserve(int64_t patches, int frames) {
  Impl& impl = *impl_;
  if (patches <= impl.patch_capacity && frames <= impl.frame_capacity) return Status::Ok();
  patches = std::max(patches, impl.patch_capacity);
  frames = std::max(frames, impl.frame_capacity);
  impl.storage.clear();
  const VisionArch& a = arch_;
  auto alloc = [&](int64_t count, size_t size) -> Expected<void*> {
    GZ_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> b,
                        backend_->Allocate(std::max<size_t>(count * size, 64)));
    void* p = b->data();
    impl.storage.push_back(std::move(b));
    return p;
  };
  const size_t f = sizeof(float);
  const int64_t merged = patches / (a.merge * a.merge) + 1;
  GZ_ASSIGN_OR_RETURN(void* pixels, alloc(patches * a.PatchFloats(), f));
  GZ_ASSIGN_OR_RETURN(void* x, alloc(patches * a.dim, f));
  GZ_ASSIGN_OR_RETURN(void* h, alloc(patches * a.dim, f));
  GZ_ASSIGN_OR_RETURN(void* q, alloc(patches * a.dim, f));
  GZ_ASSIGN_OR_RETURN(void* k, alloc(patches * a.dim, f));
  GZ_ASSIGN_OR_RETURN(void* v, alloc(patches * a.dim, f));
  GZ_ASSIGN_OR_RETURN(void* attn, alloc(patches * a.dim, f));
  GZ_ASSIGN_OR_RETURN(void* ff, alloc(patches * std::max(a.ffn, a.dim), f));
  GZ_ASSIGN_OR_RETURN(void* ones, alloc(patches * a.ffn, f));
  GZ_ASSIGN_OR_RETURN(void* m1, alloc(merged * a.MergedDim(), f));
  GZ_ASSIGN_OR_RETURN(void* m2, alloc(merged * a.MergedDim(), f));
  GZ_ASSIGN_OR_RETURN(void* out, alloc(merged * a.out_dim, f));
  GZ_ASSIGN_OR_RETURN(void* rotary, alloc(patches * a.heads * 2, sizeof(int32_t)));
  GZ_ASSIGN_OR_RETURN(void* starts, alloc(frames + 1, sizeof(int32_t)));
  impl.pixels = static_cast<float*>(pixels);
  impl.x = static_cast<float*>(x);
  impl.h = static_cast<float*>(h);
  impl.q = static_cast<float*>(q);
  impl.k = static_cast<float*>(k);
  impl.v = static_cast<float*>(v);
  impl.attn = static_cast<float*>(attn);
  impl.ff = static_cast<float*>(ff);
  impl.ones = static_cast<float*>(ones);
  impl.merged = static_cast<float*>(m1);
  impl.merged2 = static_cast<float*>(m2);
  impl.out = static_cast<float*>(out);
  impl.rotary = static_cast<int32_t*>(rotary);
  impl.starts = static_cast<int32_t*>(starts);
  const std::vector<float> one(patches * a.ffn, 1.0f);
  backend_->CopyToDevice(impl.ones, one.data(), one.size() * f);
  impl.patch_capacity = patches;
  impl.frame_capacity = frames;
  return Status::Ok();
}

namespace {

// One patch's position row: its four table rows weighted, summed in tap order, in one pass the
// compiler vectorizes (a pass a tap over the row took ~50 ms for 4,096 patches of 1,152).
void PositionRow(float* __restrict row, const float* __restrict t0, const float* __restrict t1,
                 const float* __restrict t2, const float* __restrict t3, const float* wt,
                 int64_t dim) {
  const float w0 = wt[0], w1 = wt[1], w2 = wt[2], w3 = wt[3];
  for (int64_t c = 0; c < dim; ++c) row[c] = t0[c] * w0 + t1[c] * w1 + t2[c] * w2 + t3[c] * w3;
}

}  // namespace

Status VisionTower::Run(std::span<const float> pixels, std::span<const VisionGrid> grids,
                        VisionOutput* out, bool keep_on_device) {
  const VisionArch& a = arch_;
  if (grids.empty()) return InvalidArgument("vision tower: no pictures");
  int64_t patches = 0;
  int frames = 0;
  std::vector<int32_t> starts = {0};
  for (size_t i = 0; i < grids.size(); ++i) {
    GZ_RETURN_IF_ERROR(CheckVisionGrid(a, grids[i], static_cast<int>(i)));
    patches += grids[i].Patches();
    if (patches > (int64_t{1} << 24))
      return InvalidArgument("vision tower: more than 2^24 patches in one run");
    for (int64_t t = 0; t < grids[i].t; ++t) {
      starts.push_back(static_cast<int32_t>(starts.back() + grids[i].h * grids[i].w));
      ++frames;
    }
  }
  if (static_cast<int64_t>(pixels.size()) != patches * a.PatchFloats()) {
    return InvalidArgument("vision tower: pixel_values holds " + std::to_string(pixels.size()) +
                           " floats, expected " + std::to_string(patches) + " patches of " +
                           std::to_string(a.PatchFloats()));
  }
  GZ_RETURN_IF_ERROR(Reserve(patches, frames));
  Impl& impl = *impl_;
  Backend& be = *backend_;
  const size_t f = sizeof(float);

  // The host-side inputs: the interpolated position rows, the rotary positions of each head's
  // two halves, the frames' bounds.
  const PositionTaps taps = VisionPositionTaps(a, grids);
  std::vector<float> pos(patches * a.dim);
  auto position_rows = [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      const int32_t* index = taps.index.data() + r * 4;
      const float* wt = taps.weight.data() + r * 4;
      const float* table = impl.pos_table.data();
      PositionRow(pos.data() + r * a.dim, table + index[0] * a.dim, table + index[1] * a.dim,
                  table + index[2] * a.dim, table + index[3] * a.dim, wt, a.dim);
    }
  };
  // A large picture's rows on a few host threads (4,096 patches: ~19 MB written).
  if (patches >= kParallelPatches) {
    if (!impl.threads) {
      const int cores = static_cast<int>(std::thread::hardware_concurrency());
      impl.threads = std::make_unique<ThreadPool>(std::clamp(cores / 2, 1, 8));
    }
    impl.threads->ParallelFor(patches, 64, position_rows);
  } else {
    position_rows(0, patches, 0);
  }
  const std::vector<int32_t> hw = VisionRotaryPositions(a, grids);
  std::vector<int32_t> rotary(patches * a.heads * 2);
  for (int64_t r = 0; r < patches; ++r) {
    for (int hd = 0; hd < a.heads; ++hd) {
      rotary[(r * a.heads + hd) * 2] = hw[2 * r];
      rotary[(r * a.heads + hd) * 2 + 1] = hw[2 * r + 1];
    }
  }
  be.CopyToDevice(impl.pixels, pixels.data(), pixels.size() * f);
  be.CopyToDevice(impl.h, pos.data(), pos.size() * f);
  be.CopyToDevice(impl.rotary, rotary.data(), rotary.size() * sizeof(int32_t));
  be.CopyToDevice(impl.starts, starts.data(), starts.size() * sizeof(int32_t));

  const int64_t n = patches;
  const int64_t merged = n / (a.merge * a.merge);
  const float eps = 1e-6f;
  impl.patch_embed.Issue(be, impl.pixels, n, impl.x);
  be.Add({impl.x, impl.h, n * a.dim});

  auto run_merger = [&](const Merger& m, float* result) {
    // Rows of merge * merge patches' hidden states are adjacent: [merged, MergedDim()].
    if (m.norm_merged) {
      be.LayerNorm(
          {impl.merged, impl.x, nullptr, m.norm.weight, m.norm.bias, merged, a.MergedDim(), eps});
    } else {
      be.LayerNorm({impl.merged, impl.x, nullptr, m.norm.weight, m.norm.bias, n, a.dim, eps});
    }
    m.fc1.Issue(be, impl.merged, merged, impl.merged2);
    be.Gelu({impl.merged2, merged * a.MergedDim()});
    m.fc2.Issue(be, impl.merged2, merged, result);
  };

  out->rows = merged;
  out->embeddings.clear();
  out->deepstack.clear();
  out->device.reset();
  // Where the merger and each deepstack merger write: planes of the kept rows, or impl.out
  // copied to the host after each.
  const int64_t plane = merged * a.out_dim;
  float* kept = nullptr;
  if (keep_on_device) {
    GZ_ASSIGN_OR_RETURN(
        std::unique_ptr<Buffer> buffer,
        be.Allocate(std::max<size_t>((1 + a.deepstack.size()) * plane * f, 64)));
    kept = buffer->as<float>();
    out->device = std::move(buffer);
  } else {
    out->embeddings.resize(plane);
    out->deepstack.assign(a.deepstack.size(), std::vector<float>(plane));
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(a.head_dim));
  for (int l = 0; l < a.depth; ++l) {
    const Block& b = impl.blocks[l];
    be.LayerNorm({impl.h, impl.x, nullptr, b.norm1.weight, b.norm1.bias, n, a.dim, eps});
    MatmulParams qkv;
    qkv.x = impl.h;
    qkv.rows = n;
    qkv.outputs = 3;
    qkv.w[0] = &b.q, qkv.w[1] = &b.k, qkv.w[2] = &b.v;
    qkv.bias[0] = b.q_bias, qkv.bias[1] = b.k_bias, qkv.bias[2] = b.v_bias;
    qkv.out[0] = impl.q, qkv.out[1] = impl.k, qkv.out[2] = impl.v;
    be.Matmul(qkv);
    // Each half head as a head of its own: [patches * heads * 2, head_dim / 2].
    for (float* t : {impl.q, impl.k}) {
      be.Rope({t, n * a.heads * 2, /*heads=*/1, a.head_dim / 2, /*rotary_dims=*/a.head_dim / 2,
               impl.rotary, impl.inv_freq, /*norm=*/nullptr, eps});
    }
    be.EncoderAttention(
        {impl.attn, impl.q, impl.k, impl.v, impl.starts, n, frames, a.heads, a.head_dim, scale});
    b.proj.Issue(be, impl.attn, n, impl.h);
    be.Add({impl.x, impl.h, n * a.dim});
    be.LayerNorm({impl.h, impl.x, nullptr, b.norm2.weight, b.norm2.bias, n, a.dim, eps});
    b.fc1.Issue(be, impl.h, n, impl.ff);
    if (a.act == VisionAct::kGeluTanh) {
      // gelu_pytorch_tanh(x) * 1: the Glu op's gelu-tanh gate over an up of ones, exactly.
      be.Glu({impl.ff, impl.ff, impl.ones, n * a.ffn, Activation::kGeluTanh});
    } else {
      be.Gelu({impl.ff, n * a.ffn});
    }
    b.fc2.Issue(be, impl.ff, n, impl.h);
    be.Add({impl.x, impl.h, n * a.dim});
    for (size_t i = 0; i < a.deepstack.size(); ++i) {
      if (a.deepstack[i] != l) continue;
      if (kept) {
        run_merger(impl.deepstack[i], kept + (1 + i) * plane);
      } else {
        run_merger(impl.deepstack[i], impl.out);
        be.CopyToHost(out->deepstack[i].data(), impl.out, plane * f);
      }
    }
  }
  if (kept) {
    run_merger(impl.merger, kept);
    return Status::Ok();
  }
  run_merger(impl.merger, impl.out);
  be.CopyToHost(out->embeddings.data(), impl.out, plane * f);
  be.Synchronize();
  return Status::Ok();
}

}  // namespace gizllm
