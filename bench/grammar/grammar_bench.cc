// Structured output speed on one thread: compiling each JSON schema of a folder (schema to GBNF to
// grammar), and the token mask of every step of documents generated under each schema (a random
// walk over the allowed tokens that leans toward closing what is open), timed with the mask cache
// (what a request pays), without it (the class trie walk alone) and by the byte trie alone from
// the state itself, not its canonical form (the plain walk; its masks must equal the others'),
// each split by the masks' width (`wide`: more
// than half the vocabulary allowed, as inside strings); and the time the request's matcher takes
// to accept each picked token (`accept`). Prints one JSON line.
//   grammar_bench --tokenizer PATH [--schemas tests/grammar/schemas] [--grammar GBNF_FILE]
//                 [--docs 3] [--seed 1] [--dump-walks FILE]
// --dump-walks: each document's walk, a JSON line each ({"file": the schema's file name, "doc": d,
// "masks": the masks timed, "tokens": the tokens picked, "mask_us": each step's mask time (the
// cached one)}), for another engine's masks to be timed over the same steps and set beside these
// (llama_grammar_peer.cpp); the timed calls are the same with or without it.
// --grammar: documents of that GBNF grammar instead of the schemas.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "grammar/json_schema.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace gizllm;

double Micros(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

struct Summary {
  double mean = 0, p50 = 0, p99 = 0, max = 0;
  size_t count = 0;
};

Summary Summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.count = v.size();
  for (double x : v) s.mean += x;
  s.mean /= v.size();
  s.p50 = v[v.size() / 2];
  s.p99 = v[std::min(v.size() - 1, static_cast<size_t>(v.size() * 0.99))];
  s.max = v.back();
  return s;
}

std::string Json(const char* name, const Summary& s) {
  char buf[256];
  snprintf(
      buf, sizeof buf,
      "\"%s\":{\"count\":%zu,\"mean_us\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f,\"max_us\":%.1f}",
      name, s.count, s.mean, s.p50, s.p99, s.max);
  return buf;
}

bool Closing(const std::string& b) {
  return !b.empty() && std::all_of(b.begin(), b.end(), [](char c) {
    return std::strchr("\"}],:0123456789 ", c) != nullptr;
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, schemas = "tests/grammar/schemas", gbnf_path, dump_path;
  int docs = 3;
  uint32_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc)
      tokenizer_path = argv[++i];
    else if (a == "--schemas" && i + 1 < argc)
      schemas = argv[++i];
    else if (a == "--grammar" && i + 1 < argc)
      gbnf_path = argv[++i];
    else if (a == "--docs" && i + 1 < argc)
      docs = std::stoi(argv[++i]);
    else if (a == "--seed" && i + 1 < argc)
      seed = static_cast<uint32_t>(std::stoul(argv[++i]));
    else if (a == "--dump-walks" && i + 1 < argc)
      dump_path = argv[++i];
    else {
      fprintf(stderr,
              "usage: grammar_bench --tokenizer PATH [--schemas DIR] [--grammar FILE] [--docs N] "
              "[--seed S] [--dump-walks FILE]\n");
      return 2;
    }
  }
  Expected<Tokenizer> tokenizer = Tokenizer::Load(tokenizer_path);
  if (!tokenizer.ok()) {
    fprintf(stderr, "%s\n", tokenizer.status().message().c_str());
    return 1;
  }
  auto t0 = std::chrono::steady_clock::now();
  auto vocabulary = std::make_shared<const TokenVocabulary>(
      TokenVocabulary::FromTokenizer(*tokenizer, tokenizer->vocab_size()));
  const double vocabulary_ms = Micros(t0, std::chrono::steady_clock::now()) / 1000;
  std::vector<int32_t> stop;
  for (const char* s : {"<|im_end|>", "<|endoftext|>"}) {
    if (tokenizer->TokenId(s) >= 0) stop.push_back(tokenizer->TokenId(s));
  }
  std::vector<std::filesystem::path> files;
  if (!gbnf_path.empty()) {
    files.push_back(gbnf_path);
  } else {
    for (const auto& e : std::filesystem::directory_iterator(schemas)) {
      if (e.path().extension() == ".json") files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<double> compile_us, cached_us, walk_us, bytes_us, accept_us;
  std::vector<double> wide_us, narrow_us, wide_bytes_us, narrow_bytes_us;  // uncached, by width
  int refused = 0;
  std::mt19937 rng(seed);
  std::ofstream dump;
  if (!dump_path.empty()) {
    dump.open(dump_path);
    if (!dump) {
      fprintf(stderr, "%s: cannot write\n", dump_path.c_str());
      return 1;
    }
  }
  for (const auto& f : files) {
    std::ifstream in(f);
    std::stringstream text;
    text << in.rdbuf();
    auto c0 = std::chrono::steady_clock::now();
    Expected<Grammar> g = gbnf_path.empty() ? JsonSchemaGrammar(text.str()) : ParseGbnf(text.str());
    compile_us.push_back(Micros(c0, std::chrono::steady_clock::now()));
    if (!g.ok()) {
      ++refused;
      fprintf(stderr, "%s: %s\n", f.filename().c_str(), g.status().message().c_str());
      continue;
    }
    TokenGrammar tg{std::make_shared<const Grammar>(std::move(*g)), vocabulary};
    for (int d = 0; d < docs; ++d) {
      TokenMatcher cached(tg), walked(tg, /*cache=*/false),
          by_bytes(tg, /*cache=*/false, /*classes=*/false, /*canonical=*/false);
      std::vector<uint64_t> mask, other, plain;
      std::vector<int32_t> walk;  // the tokens picked (--dump-walks)
      std::vector<double> walk_mask_us;
      int masks = 0;
      for (int step = 0; step < 400; ++step) {
        ++masks;
        auto m0 = std::chrono::steady_clock::now();
        cached.FillMask(stop, &mask);
        auto m1 = std::chrono::steady_clock::now();
        walked.FillMask(stop, &other);
        auto m2 = std::chrono::steady_clock::now();
        by_bytes.FillMask(stop, &plain);
        auto m3 = std::chrono::steady_clock::now();
        cached_us.push_back(Micros(m0, m1));
        walk_mask_us.push_back(cached_us.back());
        walk_us.push_back(Micros(m1, m2));
        bytes_us.push_back(Micros(m2, m3));
        if (mask != other || mask != plain) {
          fprintf(stderr, "%s: cached, class and byte walks' masks differ\n", f.filename().c_str());
          return 1;
        }
        std::vector<int32_t> allowed, closing;
        for (int32_t t = 0; t < vocabulary->size(); ++t) {
          if (!((mask[t >> 6] >> (t & 63)) & 1)) continue;
          allowed.push_back(t);
          if (Closing(vocabulary->bytes(t))) closing.push_back(t);
        }
        const bool wide = allowed.size() * 2 > static_cast<size_t>(vocabulary->size());
        (wide ? wide_us : narrow_us).push_back(Micros(m1, m2));
        (wide ? wide_bytes_us : narrow_bytes_us).push_back(Micros(m2, m3));
        if (allowed.empty()) break;
        const bool done = cached.Complete() && (step > 8 || rng() % 4 == 0);
        if (done) break;
        const std::vector<int32_t>& from =
            !closing.empty() && (step > 60 || rng() % 3 == 0) ? closing : allowed;
        const int32_t pick = from[rng() % from.size()];
        if (std::find(stop.begin(), stop.end(), pick) != stop.end()) break;
        const auto a0 = std::chrono::steady_clock::now();
        const bool took = cached.Accept(pick);
        accept_us.push_back(Micros(a0, std::chrono::steady_clock::now()));
        if (!took || !walked.Accept(pick) || !by_bytes.Accept(pick)) {
          fprintf(stderr, "%s: an allowed token was refused\n", f.filename().c_str());
          return 1;
        }
        walk.push_back(pick);
      }
      if (dump.is_open()) {
        dump << "{\"file\": \"" << f.filename().string() << "\", \"doc\": " << d
             << ", \"masks\": " << masks << ", \"tokens\": [";
        for (size_t i = 0; i < walk.size(); ++i) dump << (i ? ", " : "") << walk[i];
        dump << "], \"mask_us\": [";
        char us[32];
        for (size_t i = 0; i < walk_mask_us.size(); ++i) {
          snprintf(us, sizeof us, "%s%.2f", i ? ", " : "", walk_mask_us[i]);
          dump << us;
        }
        dump << "]}\n";
      }
    }
  }
  printf(
      "{\"tokenizer\":\"%s\",\"vocab\":%lld,\"vocabulary_ms\":%.1f,\"schemas\":%zu,"
      "\"refused\":%d,%s,%s,%s,%s,%s,%s,%s,%s,%s}\n",
      tokenizer_path.c_str(), static_cast<long long>(vocabulary->size()), vocabulary_ms,
      files.size(), refused, Json("compile", Summarize(compile_us)).c_str(),
      Json("mask", Summarize(cached_us)).c_str(), Json("mask_uncached", Summarize(walk_us)).c_str(),
      Json("mask_bytes", Summarize(bytes_us)).c_str(),
      Json("uncached_wide", Summarize(wide_us)).c_str(),
      Json("uncached_narrow", Summarize(narrow_us)).c_str(),
      Json("bytes_wide", Summarize(wide_bytes_us)).c_str(),
      Json("bytes_narrow", Summarize(narrow_bytes_us)).c_str(),
      Json("accept", Summarize(accept_us)).c_str());
  return 0;
}
