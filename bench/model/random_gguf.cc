// Writes a random-weight GGUF v3 file of the Qwen3 family (general.architecture "qwen3") of any
// shape, with the linears in a chosen ggml block type, for speed benchmarks of gizllm and
// llama.cpp on models that are not on this machine (a Qwen3-8B shape in Q4_K, Q8_0, Q1_0, ...).
//
// The file is streamed: the header (metadata and tensor infos, every offset computed from the
// known sizes) first, then each tensor's data in chunks of whole blocks, so memory stays at one
// chunk whatever the model's size. Codes are random bytes (splitmix64); each block's f16 scale
// fields are +-scale / range with a random sign (BlockScales: a block's largest |weight| is about
// --scale), never random bits, which could be NaN or infinite. Norm weights are F32 ones.
//
// Names, metadata keys and layout are those of llama.cpp's convert_hf_to_gguf.py and
// llama-quantize: the output head defaults to Q6_K (Q8_0 where hidden is not whole 256-element
// blocks) for the quantized types other than Q8_0, as llama-quantize's Q4_K_M does.
//
// Usage: random_gguf --out FILE --type Q4_K|Q8_0|Q1_0|Q4_0|Q6_K|BF16|F16 [--head-type T]
//            [--embd-type T] [--hidden 4096] [--layers 36] [--heads 32] [--kv-heads 8]
//            [--head-dim 128] [--ffn 12288] [--vocab 151936] [--context 40960] [--tied]
//            [--tokenizer DIR] [--scale 0.02] [--seed 1]
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "formats/ggml_blocks.h"
#include "formats/gguf.h"
#include "gguf_from_hf.h"  // tests/: BlockScales, WriteTokenizerMetadata
#include "gguf_writer.h"   // tests/: the metadata's bytes

namespace gizllm {
namespace {

constexpr uint64_t kAlignment = 32;            // GGUF's default general.alignment
constexpr uint64_t kChunkBytes = 32ull << 20;  // data generated and written at a time

constexpr char kUsage[] =
    R"(random_gguf: writes a random-weight Qwen3-family GGUF (v3) of a given shape, streamed.

Usage: random_gguf --out FILE --type T [options]

  --out FILE        the GGUF file to write
  --type T          block type of the layers' linears: Q4_K, Q8_0, Q1_0, Q4_0, Q6_K, BF16, F16
                    (also Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, Q2_0,
                    F32)
  --head-type T     output.weight's type (default: Q6_K for the quantized --type other than Q8_0,
                    Q8_0 where --hidden is not whole 256-element blocks, else --type)
  --embd-type T     token_embd.weight's type (default: --type for F16, BF16 and F32, else Q8_0)
  --hidden N        embedding_length (4096)
  --layers N        block_count (36)
  --heads N         attention.head_count (32)
  --kv-heads N      attention.head_count_kv (8)
  --head-dim N      attention.key_length and value_length (128)
  --ffn N           feed_forward_length (12288)
  --vocab N         tokens, the rows of token_embd and output (151936)
  --context N       context_length (40960)
  --tied            no output.weight: the head reads token_embd.weight
  --tokenizer DIR   the tokenizer.ggml.* keys from DIR/tokenizer.json (+ tokenizer_config.json,
                    config.json), pre-tokenizer qwen2; its tokens must fit in --vocab (the rest
                    are unused [PADn] tokens). Without it: a minimal byte-level vocabulary.
  --scale X         about the largest |weight| of a block (0.02)
  --seed N          random seed (1)

The defaults are Qwen3-8B's shape. Example (8B in Q4_K with a Q6_K head, as Q4_K_M):
  random_gguf --out qwen3-8b-q4_k.gguf --type Q4_K
)";

// splitmix64: 8 random bytes a call in a few cycles.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

bool IsFloat(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16;
}

// Random weights of one type: block types get random codes and f16 scale fields of
// +-scale / range (the sign from the random byte the field replaces); F16, BF16 and F32 get
// values uniform in [-scale, scale].
class RandomWeights {
 public:
  // False for a type whose scale fields are not known here (the grid IQ types, ...).
  bool Init(GgmlType type, float scale) {
    type_ = type;
    if (!GgmlBlockOf(type, &block_)) return false;
    scale_ = scale;
    if (type == GgmlType::kF16 || type == GgmlType::kBF16) {
      // 16 random bits pick one of 65536 evenly spaced values.
      halves_.resize(65536);
      for (int i = 0; i < 65536; ++i) {
        const float x = scale * ((static_cast<float>(i) + 0.5f) / 32768.0f - 1.0f);
        halves_[i] = type == GgmlType::kF16 ? F32ToF16(x) : F32ToBf16(x);
      }
      return true;
    }
    if (type == GgmlType::kF32) return true;
    float range = 1;
    if (!testing::BlockScales(type, &scale_offsets_, &range)) return false;
    scale_bits_[0] = F32ToF16(scale / range);
    scale_bits_[1] = F32ToF16(-scale / range);
    return true;
  }

  const GgmlBlock& block() const { return block_; }

  // `blocks` blocks into `out` [blocks * block().bytes].
  void Fill(SplitMix64* rng, uint8_t* out, int64_t blocks) const {
    const size_t bytes = static_cast<size_t>(blocks * block_.bytes);
    if (type_ == GgmlType::kF16 || type_ == GgmlType::kBF16) {
      uint16_t* v = reinterpret_cast<uint16_t*>(out);  // [blocks]
      int64_t i = 0;
      for (; i + 4 <= blocks; i += 4) {
        const uint64_t r = rng->Next();
        v[i] = halves_[r & 0xffff], v[i + 1] = halves_[(r >> 16) & 0xffff];
        v[i + 2] = halves_[(r >> 32) & 0xffff], v[i + 3] = halves_[r >> 48];
      }
      for (; i < blocks; ++i) v[i] = halves_[rng->Next() & 0xffff];
      return;
    }
    if (type_ == GgmlType::kF32) {
      float* v = reinterpret_cast<float*>(out);  // [blocks]
      for (int64_t i = 0; i < blocks; ++i) {
        v[i] = scale_ * (static_cast<float>(rng->Next() >> 40) / 8388608.0f - 1.0f);
      }
      return;
    }
    size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
      const uint64_t r = rng->Next();
      std::memcpy(out + i, &r, 8);
    }
    if (i < bytes) {
      const uint64_t r = rng->Next();
      std::memcpy(out + i, &r, bytes - i);
    }
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* block = out + b * block_.bytes;
      for (int off : scale_offsets_) {
        const uint16_t h = scale_bits_[block[off] & 1];
        block[off] = static_cast<uint8_t>(h & 0xff);
        block[off + 1] = static_cast<uint8_t>(h >> 8);
      }
    }
  }

 private:
  GgmlType type_ = GgmlType::kF32;
  GgmlBlock block_;
  float scale_ = 0;
  std::vector<int> scale_offsets_;   // byte offsets of a block's f16 scale fields
  uint16_t scale_bits_[2] = {0, 0};  // +scale / range, -scale / range as f16
  std::vector<uint16_t> halves_;     // F16 and BF16: [65536] values in [-scale, scale]
};

struct Options {
  std::string out;
  std::string tokenizer;  // a folder with tokenizer.json, or empty
  GgmlType type = GgmlType::kQ4_K;
  GgmlType head_type = GgmlType::kQ6_K;
  GgmlType embd_type = GgmlType::kQ8_0;
  bool type_set = false, head_type_set = false, embd_type_set = false;
  int64_t hidden = 4096;
  int64_t layers = 36;
  int64_t heads = 32;
  int64_t kv_heads = 8;
  int64_t head_dim = 128;
  int64_t ffn = 12288;
  int64_t vocab = 151936;
  int64_t context = 40960;
  bool tied = false;
  float scale = 0.02f;
  uint64_t seed = 1;
  bool help = false;

  // Fills the defaults of head_type and embd_type from type; errors name the bad option.
  Status Check() {
    if (help) return Status::Ok();
    if (out.empty()) return InvalidArgument("--out FILE is required");
    if (!type_set) return InvalidArgument("--type T is required");
    const std::pair<const char*, int64_t> sizes[] = {
        {"--hidden", hidden},     {"--layers", layers},     {"--heads", heads},
        {"--kv-heads", kv_heads}, {"--head-dim", head_dim}, {"--ffn", ffn},
        {"--vocab", vocab},       {"--context", context}};
    for (const auto& [name, v] : sizes) {
      if (v <= 0 || v > (int64_t{1} << 31)) {
        return InvalidArgument(std::string(name) + " must be in [1, 2^31], got " +
                               std::to_string(v));
      }
    }
    if (heads % kv_heads != 0) {
      return InvalidArgument("--heads " + std::to_string(heads) + " is not a multiple of " +
                             "--kv-heads " + std::to_string(kv_heads));
    }
    if (!(scale > 0.0f && scale < 1e4f)) return InvalidArgument("--scale must be in (0, 1e4)");
    GgmlBlock q6_k;
    GgmlBlockOf(GgmlType::kQ6_K, &q6_k);
    if (!head_type_set) {
      head_type = IsFloat(type) || type == GgmlType::kQ8_0 ? type
                  : hidden % q6_k.elements == 0            ? GgmlType::kQ6_K
                                                           : GgmlType::kQ8_0;
    }
    if (!embd_type_set) embd_type = IsFloat(type) ? type : GgmlType::kQ8_0;
    return Status::Ok();
  }
};

Status ParseInt(std::string_view flag, std::string_view s, int64_t* v) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v);
  if (ec != std::errc() || end != s.data() + s.size()) {
    return InvalidArgument(std::string(flag) + " takes an integer, got \"" + std::string(s) + "\"");
  }
  return Status::Ok();
}

Status ParseType(std::string_view flag, std::string_view s, GgmlType* type) {
  RandomWeights probe;
  if (!GgmlTypeFromName(s, type) || !probe.Init(*type, 1.0f)) {
    return InvalidArgument(std::string(flag) + ": unknown or unsupported block type \"" +
                           std::string(s) +
                           "\" (Q4_K, Q8_0, Q1_0, Q4_0, Q6_K, BF16, F16, Q4_1, Q5_0, Q5_1, Q2_K, "
                           "Q3_K, Q5_K, IQ4_NL, IQ4_XS, TQ1_0, TQ2_0, Q2_0, F32)");
  }
  return Status::Ok();
}

Status ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      o->help = true;
      continue;
    }
    if (a == "--tied") {
      o->tied = true;
      continue;
    }
    if (i + 1 >= argc) return InvalidArgument(std::string(a) + " needs a value (see --help)");
    const std::string_view v = argv[++i];
    int64_t* integer = a == "--hidden"     ? &o->hidden
                       : a == "--layers"   ? &o->layers
                       : a == "--heads"    ? &o->heads
                       : a == "--kv-heads" ? &o->kv_heads
                       : a == "--head-dim" ? &o->head_dim
                       : a == "--ffn"      ? &o->ffn
                       : a == "--vocab"    ? &o->vocab
                       : a == "--context"  ? &o->context
                                           : nullptr;
    if (integer) {
      GZ_RETURN_IF_ERROR(ParseInt(a, v, integer));
    } else if (a == "--seed") {
      int64_t seed;
      GZ_RETURN_IF_ERROR(ParseInt(a, v, &seed));
      o->seed = static_cast<uint64_t>(seed);
    } else if (a == "--scale") {
      char* end = nullptr;
      const std::string s(v);
      o->scale = std::strtof(s.c_str(), &end);
      if (s.empty() || *end != '\0') return InvalidArgument("--scale takes a number, got " + s);
    } else if (a == "--out") {
      o->out = v;
    } else if (a == "--tokenizer") {
      o->tokenizer = v;
    } else if (a == "--type") {
      GZ_RETURN_IF_ERROR(ParseType(a, v, &o->type));
      o->type_set = true;
    } else if (a == "--head-type") {
      GZ_RETURN_IF_ERROR(ParseType(a, v, &o->head_type));
      o->head_type_set = true;
    } else if (a == "--embd-type") {
      GZ_RETURN_IF_ERROR(ParseType(a, v, &o->embd_type));
      o->embd_type_set = true;
    } else {
      return InvalidArgument("unknown option " + std::string(a) + " (see --help)");
    }
  }
  return o->Check();
}

// What a tensor's bytes hold.
enum class Fill { kOnes, kRandom };

struct PlannedTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> shape;  // outermost first: [rows, columns] or [columns]
  Fill fill = Fill::kRandom;
  uint64_t bytes = 0;
  uint64_t offset = 0;  // from the data's start, a multiple of kAlignment
};

// The tensors in convert_hf_to_gguf.py's order and names, with their sizes and offsets. An error
// where a tensor's columns (its inputs, GGUF's ne[0]) are not whole blocks of its type.
Expected<std::vector<PlannedTensor>> PlanTensors(const Options& o) {
  const int64_t q = o.heads * o.head_dim, kv = o.kv_heads * o.head_dim;
  std::vector<PlannedTensor> plan;
  auto add = [&](std::string name, GgmlType type, std::vector<int64_t> shape, Fill fill) {
    plan.push_back({std::move(name), type, std::move(shape), fill});
  };
  add("token_embd.weight", o.embd_type, {o.vocab, o.hidden}, Fill::kRandom);
  for (int64_t l = 0; l < o.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", GgmlType::kF32, {o.hidden}, Fill::kOnes);
    add(p + "attn_q.weight", o.type, {q, o.hidden}, Fill::kRandom);
    add(p + "attn_k.weight", o.type, {kv, o.hidden}, Fill::kRandom);
    add(p + "attn_v.weight", o.type, {kv, o.hidden}, Fill::kRandom);
    add(p + "attn_output.weight", o.type, {o.hidden, q}, Fill::kRandom);
    add(p + "attn_q_norm.weight", GgmlType::kF32, {o.head_dim}, Fill::kOnes);
    add(p + "attn_k_norm.weight", GgmlType::kF32, {o.head_dim}, Fill::kOnes);
    add(p + "ffn_norm.weight", GgmlType::kF32, {o.hidden}, Fill::kOnes);
    add(p + "ffn_gate.weight", o.type, {o.ffn, o.hidden}, Fill::kRandom);
    add(p + "ffn_up.weight", o.type, {o.ffn, o.hidden}, Fill::kRandom);
    add(p + "ffn_down.weight", o.type, {o.hidden, o.ffn}, Fill::kRandom);
  }
  add("output_norm.weight", GgmlType::kF32, {o.hidden}, Fill::kOnes);
  if (!o.tied) add("output.weight", o.head_type, {o.vocab, o.hidden}, Fill::kRandom);

  uint64_t offset = 0;
  for (PlannedTensor& t : plan) {
    GgmlBlock block;
    GgmlBlockOf(t.type, &block);
    const int64_t columns = t.shape.back();
    if (columns % block.elements != 0) {
      return InvalidArgument(t.name + " in " + GgmlTypeName(t.type) + ": its " +
                             std::to_string(columns) + " columns (inputs) are not whole " +
                             std::to_string(block.elements) + "-element blocks of " +
                             GgmlTypeName(t.type) + "; pick another type or shape");
    }
    const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 1;
    t.bytes = static_cast<uint64_t>(rows) * (columns / block.elements) * block.bytes;
    t.offset = offset;
    offset = (offset + t.bytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  return plan;
}

// llama.cpp's LLAMA_FTYPE_* of a model whose linears are `type` (0 where none is written).
uint32_t FileType(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return 0;  // ALL_F32
    case GgmlType::kF16:
      return 1;
    case GgmlType::kQ4_0:
      return 2;
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kQ4_K:
      return 15;  // Q4_K_M
    case GgmlType::kQ6_K:
      return 18;
    case GgmlType::kBF16:
      return 32;
    case GgmlType::kQ1_0:
      return 40;
    default:
      return 0;
  }
}

// GPT-2's byte-level alphabet: byte b as the code point bytes_to_unicode() gives it, in UTF-8.
std::string ByteToken(int b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
  int cp = b;
  if (!printable) {
    int n = 0;  // the count of non-printable bytes below b
    for (int c = 0; c < b; ++c) {
      if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE))) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// A small gpt2-style vocabulary of `vocab` tokens that both engines load: the 256 byte tokens, a
// few merges and their tokens, filler tokens "t<id>" that no text reaches, and the Qwen special
// tokens <|endoftext|> (bos, padding), <|im_start|> and <|im_end|> (eos) as the last three ids.
Status WriteMinimalVocab(int64_t vocab, testing::GgufWriter* w) {
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"Ġ", "t"}, {"h", "e"}, {"i", "n"}, {"Ġ", "a"}, {"Ġt", "he"}};
  const std::vector<std::string> specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  const int64_t needed = 256 + static_cast<int64_t>(merges.size() + specials.size());
  if (vocab < needed) {
    return InvalidArgument("--vocab " + std::to_string(vocab) + " is below the " +
                           std::to_string(needed) + " tokens of the minimal vocabulary");
  }
  constexpr int32_t kNormal = 1, kControl = 3;
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(ByteToken(b));
  std::vector<std::string> merge_lines;
  for (const auto& [left, right] : merges) {
    tokens.push_back(left + right);
    merge_lines.push_back(left + " " + right);
  }
  while (static_cast<int64_t>(tokens.size()) < vocab - static_cast<int64_t>(specials.size())) {
    tokens.push_back("t" + std::to_string(tokens.size()));
  }
  std::vector<int32_t> types(tokens.size(), kNormal);
  for (const std::string& s : specials) {
    tokens.push_back(s);
    types.push_back(kControl);
  }
  const uint32_t end_of_text = static_cast<uint32_t>(vocab - 3);
  w->String("tokenizer.ggml.model", "gpt2");
  w->String("tokenizer.ggml.pre", "qwen2");
  w->Strings("tokenizer.ggml.tokens", tokens);
  w->Int32s("tokenizer.ggml.token_type", types);
  w->Strings("tokenizer.ggml.merges", merge_lines);
  w->Uint32("tokenizer.ggml.bos_token_id", end_of_text);
  w->Uint32("tokenizer.ggml.eos_token_id", end_of_text + 2);
  w->Uint32("tokenizer.ggml.padding_token_id", end_of_text);
  w->Bool("tokenizer.ggml.add_bos_token", false);
  w->String("tokenizer.chat_template",
            "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + "
            "message['content'] + '<|im_end|>' + '\\n' }}{%- endfor %}{%- if "
            "add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}");
  return Status::Ok();
}

// The tokenizer.ggml.* keys of a Hugging Face tokenizer folder, its ids below `vocab`.
Status WriteFolderVocab(const std::string& dir, int64_t vocab, testing::GgufWriter* w) {
  namespace fs = std::filesystem;
  if (!fs::exists(dir + "/tokenizer.json")) {
    return NotFound("--tokenizer " + dir + ": no tokenizer.json there");
  }
  try {
    const nlohmann::json tok = testing::ReadJsonFile(dir + "/tokenizer.json");
    int64_t max_id = -1;
    for (const auto& [text, id] : tok.at("model").at("vocab").items()) {
      max_id = std::max(max_id, id.get<int64_t>());
    }
    for (const auto& a : tok.value("added_tokens", nlohmann::json::array())) {
      max_id = std::max(max_id, a.at("id").get<int64_t>());
    }
    if (max_id >= vocab) {
      return InvalidArgument("--tokenizer " + dir + " has token ids up to " +
                             std::to_string(max_id) + ", beyond --vocab " + std::to_string(vocab));
    }
    nlohmann::json config = fs::exists(dir + "/config.json")
                                ? testing::ReadJsonFile(dir + "/config.json")
                                : nlohmann::json::object();
    config["vocab_size"] = vocab;
    testing::WriteTokenizerMetadata(dir, "qwen2", config, w);
  } catch (const std::exception& e) {
    return InvalidArgument("--tokenizer " + dir + ": " + e.what());
  }
  return Status::Ok();
}

// The bytes before the data: "GGUF", version 3, counts, metadata, tensor infos, and the padding
// to kAlignment.
Expected<std::string> Header(const Options& o, const std::vector<PlannedTensor>& plan) {
  // Alignment 1: the test writer then adds no padding, and its bytes are the header up to the
  // end of the metadata, with `plan.size()` as the tensor count; the tensor infos follow here.
  testing::GgufWriter w(/*alignment=*/1);
  const std::string p = "qwen3.";
  w.String("general.architecture", "qwen3");
  w.String("general.name", "random qwen3 " + std::to_string(o.layers) + "x" +
                               std::to_string(o.hidden) + " " + GgmlTypeName(o.type));
  w.Uint32(p + "block_count", static_cast<uint32_t>(o.layers));
  w.Uint32(p + "context_length", static_cast<uint32_t>(o.context));
  w.Uint32(p + "embedding_length", static_cast<uint32_t>(o.hidden));
  w.Uint32(p + "feed_forward_length", static_cast<uint32_t>(o.ffn));
  w.Uint32(p + "attention.head_count", static_cast<uint32_t>(o.heads));
  w.Uint32(p + "attention.head_count_kv", static_cast<uint32_t>(o.kv_heads));
  w.Float32(p + "rope.freq_base", 1000000.0f);
  w.Float32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.Uint32(p + "attention.key_length", static_cast<uint32_t>(o.head_dim));
  w.Uint32(p + "attention.value_length", static_cast<uint32_t>(o.head_dim));
  if (uint32_t file_type = FileType(o.type); file_type != 0 || o.type == GgmlType::kF32) {
    w.Uint32("general.file_type", file_type);
  }
  w.Uint32("general.quantization_version", 2);
  if (o.tokenizer.empty()) {
    GZ_RETURN_IF_ERROR(WriteMinimalVocab(o.vocab, &w));
  } else {
    GZ_RETURN_IF_ERROR(WriteFolderVocab(o.tokenizer, o.vocab, &w));
  }
  std::string out = w.Bytes(/*tensor_count_delta=*/static_cast<int64_t>(plan.size()));
  auto le = [&out](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  for (const PlannedTensor& t : plan) {
    le(t.name.size(), 8);
    out += t.name;
    le(t.shape.size(), 4);
    for (size_t d = t.shape.size(); d-- > 0;) le(static_cast<uint64_t>(t.shape[d]), 8);
    le(static_cast<uint32_t>(t.type), 4);
    le(t.offset, 8);
  }
  out.resize((out.size() + kAlignment - 1) / kAlignment * kAlignment, '\0');
  return out;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

class File {
 public:
  explicit File(std::FILE* f) : f_(f) {}
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() {
    if (f_) std::fclose(f_);
  }
  std::FILE* get() const { return f_; }
  // Closes the file; false (errno set) if its last writes failed.
  bool Close() {
    const bool ok = std::fclose(f_) == 0;
    f_ = nullptr;
    return ok;
  }

 private:
  std::FILE* f_;
};

Status Write(const Options& o) {
  GZ_ASSIGN_OR_RETURN(std::vector<PlannedTensor> plan, PlanTensors(o));
  GZ_ASSIGN_OR_RETURN(std::string header, Header(o, plan));
  const auto start = std::chrono::steady_clock::now();
  File file(std::fopen(o.out.c_str(), "wb"));
  if (!file.get()) return NotFound(o.out + ": cannot open for writing: " + std::strerror(errno));
  auto write = [&](const void* data, size_t bytes) -> Status {
    if (std::fwrite(data, 1, bytes, file.get()) != bytes) {
      return Internal(o.out + ": write failed: " + std::strerror(errno));
    }
    return Status::Ok();
  };
  GZ_RETURN_IF_ERROR(write(header.data(), header.size()));

  std::vector<uint8_t> chunk;  // whole blocks of one tensor, up to kChunkBytes, + 8 spare bytes
  const char zeros[kAlignment] = {};
  uint64_t written = 0;  // data bytes, padding included
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedTensor& t = plan[i];
    std::fprintf(stderr, "[%zu/%zu] %-24s %-5s %-14s %9.1f MiB\n", i + 1, plan.size(),
                 t.name.c_str(), GgmlTypeName(t.type).c_str(), ShapeString(t.shape).c_str(),
                 static_cast<double>(t.bytes) / (1 << 20));
    GZ_RETURN_IF_ERROR(write(zeros, t.offset - written));
    if (t.fill == Fill::kOnes) {
      const std::vector<float> ones(t.bytes / 4, 1.0f);
      GZ_RETURN_IF_ERROR(write(ones.data(), t.bytes));
    } else {
      RandomWeights weights;
      weights.Init(t.type, o.scale);
      const GgmlBlock& block = weights.block();
      // Each tensor its own stream: the bytes do not depend on the chunk size.
      SplitMix64 rng(o.seed * 0x9e3779b97f4a7c15ull + i);
      const int64_t chunk_blocks = std::max<int64_t>(1, kChunkBytes / block.bytes);
      chunk.resize(static_cast<size_t>(chunk_blocks * block.bytes) + 8);
      for (int64_t left = t.bytes / block.bytes; left > 0;) {
        const int64_t blocks = std::min(left, chunk_blocks);
        weights.Fill(&rng, chunk.data(), blocks);
        GZ_RETURN_IF_ERROR(write(chunk.data(), static_cast<size_t>(blocks * block.bytes)));
        left -= blocks;
      }
    }
    written = t.offset + t.bytes;
  }
  // The last tensor padded too, as ggml's gguf writer does.
  const uint64_t end = (written + kAlignment - 1) / kAlignment * kAlignment;
  GZ_RETURN_IF_ERROR(write(zeros, end - written));
  written = end;
  if (!file.Close()) return Internal(o.out + ": write failed: " + std::strerror(errno));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const uint64_t total = header.size() + written;
  std::fprintf(stderr, "wrote %s: %llu bytes (%.2f GiB), %zu tensors, in %.1f s (%.0f MB/s)\n",
               o.out.c_str(), static_cast<unsigned long long>(total),
               static_cast<double>(total) / (1ull << 30), plan.size(), seconds,
               static_cast<double>(total) / 1e6 / seconds);
  return Status::Ok();
}

}  // namespace
}  // namespace gizllm

int main(int argc, char** argv) {
  gizllm::Options options;
  gizllm::Status status = gizllm::ParseArgs(argc, argv, &options);
  if (status.ok() && options.help) {
    std::fputs(gizllm::kUsage, stdout);
    return 0;
  }
  if (status.ok()) status = gizllm::Write(options);
  if (!status.ok()) {
    std::fprintf(stderr, "random_gguf: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}
