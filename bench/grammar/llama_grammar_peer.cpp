// llama.cpp's grammar masks over the same steps as grammar_bench (the in-run peer of its mask
// times): each schema compiled by llama.cpp's own json_schema_to_grammar and its grammar sampler,
// then for every document grammar_bench walked (--dump-walks), at each step the sampler applied
// to the whole vocabulary (every logit 0; the allowed ones stay finite) and the step's token
// accepted. One thread, the wall clock per call. Built against a llama.cpp build by
// peer_masks.sh; not part of gizllm's build.
//   llama_grammar_peer --model VOCAB.gguf --schemas DIR --walks FILE
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
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

std::string Summary(const char* name, std::vector<double> v) {
  if (v.empty()) return std::string("\"") + name + "\":{\"count\":0}";
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]; };
  char out[256];
  snprintf(out, sizeof out,
           "\"%s\":{\"count\":%zu,\"mean_us\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f,\"max_us\":%.1f}",
           name, v.size(), sum / v.size(), at(0.5), at(0.99), v.back());
  return out;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, schemas, walks_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--model") model_path = argv[i + 1];
    if (a == "--schemas") schemas = argv[i + 1];
    if (a == "--walks") walks_path = argv[i + 1];
  }
  if (model_path.empty() || schemas.empty() || walks_path.empty()) {
    fprintf(stderr, "usage: llama_grammar_peer --model VOCAB.gguf --schemas DIR --walks FILE\n");
    return 2;
  }
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
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
  // The walks, by schema file.
  std::map<std::string, std::vector<std::vector<int32_t>>> walks;
  {
    std::ifstream in(walks_path);
    std::string line;
    while (std::getline(in, line)) {
      const common_json j = common_json::parse(line);
      std::vector<int32_t> tokens;
      for (const auto& t : j.at("tokens")) tokens.push_back(t.get<int32_t>());
      walks[j.at("file").get<std::string>()].push_back(std::move(tokens));
    }
  }
  std::vector<double> convert_us, init_us, mask_us;
  int refused = 0, unconverted = 0, disagreed = 0, steps = 0;
  std::vector<llama_token_data> data(n_vocab);
  for (const auto& [file, docs] : walks) {
    std::string gbnf;
    const auto c0 = std::chrono::steady_clock::now();
    try {
      gbnf = json_schema_to_grammar(common_json::parse(Read(schemas + "/" + file)));
    } catch (const std::exception& e) {
      ++unconverted;
      fprintf(stderr, "%s: not converted: %s\n", file.c_str(), e.what());
      continue;
    }
    const auto c1 = std::chrono::steady_clock::now();
    convert_us.push_back(Micros(c0, c1));
    for (size_t d = 0; d < docs.size(); ++d) {
      const auto i0 = std::chrono::steady_clock::now();
      llama_sampler* s = llama_sampler_init_grammar(vocab, gbnf.c_str(), "root");
      const auto i1 = std::chrono::steady_clock::now();
      if (!s) {
        ++refused;
        fprintf(stderr, "%s: grammar refused\n", file.c_str());
        break;
      }
      if (d == 0) init_us.push_back(Micros(i0, i1));
      const std::vector<int32_t>& tokens = docs[d];
      for (size_t k = 0; k <= tokens.size(); ++k) {
        for (int32_t t = 0; t < n_vocab; ++t) data[t] = {t, 0.0f, 0.0f};
        llama_token_data_array cur = {data.data(), static_cast<size_t>(n_vocab), -1, false};
        const auto m0 = std::chrono::steady_clock::now();
        llama_sampler_apply(s, &cur);
        mask_us.push_back(Micros(m0, std::chrono::steady_clock::now()));
        ++steps;
        if (k == tokens.size()) break;
        const int32_t t = tokens[k];
        if (!std::isfinite(cur.data[t].logit)) {
          ++disagreed;  // llama.cpp refuses the token gizllm's mask allowed: the walk stops
          break;
        }
        llama_sampler_accept(s, t);
      }
      llama_sampler_free(s);
    }
  }
  printf("{\"model\":\"%s\",\"vocab\":%d,\"schemas\":%zu,\"not_converted\":%d,\"refused\":%d,"
         "\"steps\":%d,\"disagreed\":%d,%s,%s,%s}\n",
         model_path.c_str(), n_vocab, walks.size(), unconverted, refused, steps, disagreed,
         Summary("schema_to_gbnf", convert_us).c_str(), Summary("sampler_init", init_us).c_str(),
         Summary("mask", mask_us).c_str());
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
