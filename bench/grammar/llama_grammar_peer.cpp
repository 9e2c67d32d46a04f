// llama.cpp's grammar masks over grammar_bench's own steps: the in-run peer of its mask times.
// Each schema converted to GBNF by llama.cpp's json_schema_to_grammar (or a GBNF file read as it
// is) and its grammar sampler made (llama_sampler_init_grammar); then, for every document
// grammar_bench walked (`grammar_bench --dump-walks`), at each of its steps the sampler applied
// to the whole vocabulary (every logit 0: the tokens it refuses become -inf; what a llama.cpp
// request pays for a constrained step) and the walk's token accepted (llama_sampler_accept). One
// thread, the wall clock per call. A walk token llama.cpp refuses is counted (`disagreed`) and
// ends that document. Where the walks carry grammar_bench's own mask times (`mask_us`), its figures
// over the steps llama.cpp timed come beside llama.cpp's (`gizllm_mask`). Prints one JSON line. Built against a llama.cpp build by peer_masks.sh; not
// part of gizllm's build.
//   llama_grammar_peer --model VOCAB.gguf --walks WALKS.jsonl (--schemas DIR | --grammar FILE)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "json-schema-to-grammar.h"
#include "llama.h"

namespace {

double Micros(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// The same summary as grammar_bench's (mean, the sorted values at n/2 and 0.99 n, max).
std::string Json(const char* name, std::vector<double> v) {
  char buf[256];
  if (v.empty()) {
    snprintf(buf, sizeof buf, "\"%s\":{\"count\":0}", name);
    return buf;
  }
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  snprintf(buf, sizeof buf,
           "\"%s\":{\"count\":%zu,\"mean_us\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f,\"max_us\":%.1f}",
           name, v.size(), sum / v.size(), v[v.size() / 2],
           v[std::min(v.size() - 1, static_cast<size_t>(v.size() * 0.99))], v.back());
  return buf;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Walk {
  int masks = 0;
  std::vector<int32_t> tokens;
  std::vector<double> mask_us;  // grammar_bench's, a step each (when dumped)
};

// One line of --dump-walks: {"file": "NAME", "doc": D, "masks": M, "tokens": [T, ...],
// "mask_us": [US, ...]}.
bool ParseWalk(const std::string& line, std::string* file, Walk* walk) {
  const size_t f = line.find("\"file\": \""), m = line.find("\"masks\": "),
               t = line.find("\"tokens\": [");
  if (f == std::string::npos || m == std::string::npos || t == std::string::npos) return false;
  const size_t f0 = f + 9, f1 = line.find('"', f0);
  *file = line.substr(f0, f1 - f0);
  walk->masks = std::atoi(line.c_str() + m + 9);
  const char* p = line.c_str() + t + 11;
  while (*p && *p != ']') {
    char* end;
    walk->tokens.push_back(static_cast<int32_t>(std::strtol(p, &end, 10)));
    if (end == p) return false;
    p = end;
    while (*p == ',' || *p == ' ') ++p;
  }
  const size_t u = line.find("\"mask_us\": [");
  if (u == std::string::npos) return true;
  p = line.c_str() + u + 12;
  while (*p && *p != ']') {
    char* end;
    walk->mask_us.push_back(std::strtod(p, &end));
    if (end == p) return false;
    p = end;
    while (*p == ',' || *p == ' ') ++p;
  }
  return walk->mask_us.size() == static_cast<size_t>(walk->masks);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, schemas, gbnf_path, walks_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model") model_path = argv[i + 1];
    else if (a == "--schemas") schemas = argv[i + 1];
    else if (a == "--grammar") gbnf_path = argv[i + 1];
    else if (a == "--walks") walks_path = argv[i + 1];
  }
  if (model_path.empty() || walks_path.empty() || schemas.empty() == gbnf_path.empty()) {
    fprintf(stderr,
            "usage: llama_grammar_peer --model VOCAB.gguf --walks FILE (--schemas DIR | --grammar "
            "FILE)\n");
    return 2;
  }
  llama_log_set([](ggml_log_level level, const char* text, void*) {
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
  }, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (!model) {
    fprintf(stderr, "%s: cannot load\n", model_path.c_str());
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int32_t n_vocab = llama_vocab_n_tokens(vocab);

  // The walks, by file, in the order grammar_bench wrote them (sorted file names).
  std::vector<std::pair<std::string, std::vector<Walk>>> walks;
  {
    std::ifstream in(walks_path);
    std::string line, file;
    while (std::getline(in, line)) {
      Walk w;
      if (!ParseWalk(line, &file, &w)) {
        fprintf(stderr, "%s: not a walk: %s\n", walks_path.c_str(), line.c_str());
        return 1;
      }
      if (walks.empty() || walks.back().first != file) walks.push_back({file, {}});
      walks.back().second.push_back(std::move(w));
    }
  }

  std::vector<double> convert_us, init_us, compile_us, mask_us, accept_us, wide_us, narrow_us;
  std::vector<double> gizllm_us;  // grammar_bench's masks of the same steps
  int not_converted = 0, refused = 0, disagreed = 0;
  std::vector<llama_token_data> data(n_vocab);
  for (const auto& [file, docs] : walks) {
    std::string gbnf;
    const auto c0 = std::chrono::steady_clock::now();
    if (!gbnf_path.empty()) {
      gbnf = Read(gbnf_path);
    } else {
      try {
        gbnf = json_schema_to_grammar(common_json::parse(Read(schemas + "/" + file)));
      } catch (const std::exception& e) {
        ++not_converted;
        std::string what = e.what();
        std::replace(what.begin(), what.end(), '\n', ' ');
        fprintf(stderr, "%s: not converted: %s\n", file.c_str(), what.c_str());
        continue;
      }
    }
    const auto c1 = std::chrono::steady_clock::now();
    for (size_t d = 0; d < docs.size(); ++d) {
      const auto i0 = std::chrono::steady_clock::now();
      llama_sampler* s = llama_sampler_init_grammar(vocab, gbnf.c_str(), "root");
      const auto i1 = std::chrono::steady_clock::now();
      if (!s) {
        ++refused;
        fprintf(stderr, "%s: grammar refused by llama_sampler_init_grammar\n", file.c_str());
        break;
      }
      if (d == 0) {  // compiled once a schema, as grammar_bench's compile
        convert_us.push_back(Micros(c0, c1));
        init_us.push_back(Micros(i0, i1));
        compile_us.push_back(Micros(c0, c1) + Micros(i0, i1));
      }
      const Walk& w = docs[d];
      for (int k = 0; k < w.masks; ++k) {
        for (int32_t t = 0; t < n_vocab; ++t) data[t] = {t, 0.0f, 0.0f};
        llama_token_data_array cur = {data.data(), static_cast<size_t>(n_vocab), -1, false};
        const auto m0 = std::chrono::steady_clock::now();
        llama_sampler_apply(s, &cur);
        const double us = Micros(m0, std::chrono::steady_clock::now());
        mask_us.push_back(us);
        if (!w.mask_us.empty()) gizllm_us.push_back(w.mask_us[k]);
        size_t allowed = 0;
        for (size_t i = 0; i < cur.size; ++i) allowed += std::isfinite(cur.data[i].logit);
        (allowed * 2 > static_cast<size_t>(n_vocab) ? wide_us : narrow_us).push_back(us);
        if (k >= static_cast<int>(w.tokens.size())) break;
        const int32_t t = w.tokens[k];
        if (cur.data[t].id != t || !std::isfinite(cur.data[t].logit)) {
          ++disagreed;
          fprintf(stderr, "%s doc %zu step %d: token %d refused\n", file.c_str(), d, k, t);
          break;
        }
        const auto a0 = std::chrono::steady_clock::now();
        llama_sampler_accept(s, t);
        accept_us.push_back(Micros(a0, std::chrono::steady_clock::now()));
      }
      llama_sampler_free(s);
    }
  }
  printf("{\"model\":\"%s\",\"vocab\":%d,\"schemas\":%zu,\"not_converted\":%d,\"refused\":%d,"
         "\"disagreed\":%d,%s,%s,%s,%s,%s,%s,%s,%s}\n",
         model_path.c_str(), n_vocab, walks.size(), not_converted, refused, disagreed,
         Json("compile", compile_us).c_str(), Json("schema_to_gbnf", convert_us).c_str(),
         Json("sampler_init", init_us).c_str(), Json("mask", mask_us).c_str(),
         Json("wide", wide_us).c_str(), Json("narrow", narrow_us).c_str(),
         Json("accept", accept_us).c_str(), Json("gizllm_mask", gizllm_us).c_str());
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
