// Tokenizer speed: loading a tokenizer.json, and encoding the golden corpus lines (each a text)
// repeated to a size, on one thread. Prints one JSON line; bench/tokenizer/run.sh sets it beside
// Hugging Face's figures measured in the same run.
//   tokenizer_bench --tokenizer PATH [--corpus tests/golden/tokenizer/corpus.jsonl] [--mb 20]
//                   [--repeat 3] [--load-only]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "tokenizer/tokenizer.h"

namespace {

// CPU time of this process: on a shared, loaded machine it varies much less than wall time.
double Now() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// A corpus line (one JSON string) decoded; hf_bench.mjs builds the same texts.
std::string UnescapeJsonString(const std::string& line) {
  std::string out;
  for (size_t i = 1; i + 1 < line.size(); ++i) {
    char c = line[i];
    if (c != '\\') {
      out += c;
      continue;
    }
    char n = line[++i];
    switch (n) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'u': {
        auto hex = [&](size_t at) {
          return static_cast<char32_t>(std::stoul(line.substr(at, 4), nullptr, 16));
        };
        char32_t cp = hex(i + 1);
        i += 4;
        if (cp >= 0xD800 && cp < 0xDC00 && line[i + 1] == '\\' && line[i + 2] == 'u') {
          char32_t lo = hex(i + 3);
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          i += 6;
        }
        if (cp < 0x80) {
          out += static_cast<char>(cp);
        } else if (cp < 0x800) {
          out += static_cast<char>(0xC0 | (cp >> 6));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
          out += static_cast<char>(0xE0 | (cp >> 12));
          out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
          out += static_cast<char>(0xF0 | (cp >> 18));
          out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
          out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          out += static_cast<char>(0x80 | (cp & 0x3F));
        }
        break;
      }
      default:
        out += n;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, corpus_path = "tests/golden/tokenizer/corpus.jsonl";
  double mb = 20;
  int repeat = 3;
  bool load_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc)
      tokenizer_path = argv[++i];
    else if (a == "--corpus" && i + 1 < argc)
      corpus_path = argv[++i];
    else if (a == "--mb" && i + 1 < argc)
      mb = std::atof(argv[++i]);
    else if (a == "--repeat" && i + 1 < argc)
      repeat = std::atoi(argv[++i]);
    else if (a == "--load-only")
      load_only = true;
    else {
      std::fprintf(stderr, "tokenizer_bench: unknown argument %s\n", a.c_str());
      return 1;
    }
  }
  double load = 1e9;
  gizllm::Expected<gizllm::Tokenizer> tokenizer = gizllm::Status();
  for (int r = 0; r < repeat; ++r) {
    double t0 = Now();
    tokenizer = gizllm::Tokenizer::Load(tokenizer_path);
    load = std::min(load, Now() - t0);
    if (!tokenizer.ok()) {
      std::fprintf(stderr, "tokenizer_bench: %s\n", tokenizer.status().message().c_str());
      return 1;
    }
  }
  if (load_only) {
    std::printf("{\"load_s\": %.4f}\n", load);
    return 0;
  }
  auto corpus = gizllm::ReadFile(corpus_path);
  if (!corpus.ok()) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", corpus.status().message().c_str());
    return 1;
  }
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < corpus->size()) {
    size_t end = corpus->find('\n', pos);
    if (end == std::string::npos) end = corpus->size();
    if (end > pos) lines.push_back(UnescapeJsonString(corpus->substr(pos, end - pos)));
    pos = end + 1;
  }
  // The corpus lines, each a text of its own, repeated until they hold --mb megabytes.
  std::vector<std::string> texts;
  size_t size = 0;
  const size_t bytes = static_cast<size_t>(mb * 1e6);
  while (size < bytes) {
    for (const std::string& l : lines) {
      texts.push_back(l);
      size += l.size();
      if (size >= bytes) break;
    }
  }
  double best = 1e9;
  size_t tokens = 0;
  for (int r = 0; r < repeat; ++r) {
    tokens = 0;
    double t0 = Now();
    for (const std::string& text : texts) {
      auto ids = tokenizer->Encode(text);
      if (!ids.ok()) {
        std::fprintf(stderr, "tokenizer_bench: %s\n", ids.status().message().c_str());
        return 1;
      }
      tokens += ids->size();
    }
    best = std::min(best, Now() - t0);
  }
  std::printf(
      "{\"load_s\": %.4f, \"texts\": %zu, \"bytes\": %zu, \"tokens\": %zu, "
      "\"encode_s\": %.4f, \"tokens_per_s\": %.0f}\n",
      load, texts.size(), size, tokens, best, tokens / best);
  return 0;
}
