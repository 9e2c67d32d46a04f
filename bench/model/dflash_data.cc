// Training data for a DFlash drafter (model/dflash.h, tools/train_dflash.py): the model's own
// greedy answers to prompts, and its hidden states after the drafter's target layers at every
// position of prompt and answer.
//
//   dflash_data --model DIR --prompts FILE.jsonl --layers 0,2,3 --out FILE [--new 64]
//
// FILE.jsonl: {"prompt": text} or {"tokens": [ids]} a line. Output, little-endian: "DFD1", int32
// layers, int32 dim, int32 sequences; then each sequence: int32 tokens, int32 prompt tokens,
// int32 ids [tokens], f16 features [tokens, layers * dim] (layer by layer within a row: the
// hidden_states[id + 1] of each target layer id, as the drafter's fc reads them: the last layer's
// after the final norm). The answer ends at the model's stop token (not kept) or after --new
// tokens.
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "engine/engine.h"
#include "model/model.h"
#include "ops/device.h"
#include "tokenizer/tokenizer.h"

namespace gizllm {
namespace {

int Fail(const std::string& m) {
  std::fprintf(stderr, "dflash_data: %s\n", m.c_str());
  return 1;
}

int Main(int argc, char** argv) {
  std::map<std::string, std::string> a = {{"--new", "64"}, {"--device", "cpu"}, {"--threads", "0"}};
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  if (argc < 2 || !a.count("--model") || !a.count("--prompts") || !a.count("--layers") ||
      !a.count("--out")) {
    std::fprintf(stderr,
                 "usage: dflash_data --model DIR --prompts FILE.jsonl --layers 0,2,3 --out FILE "
                 "[--new 64] [--device cpu] [--threads N]\n");
    return 2;
  }
  DeviceOptions device;
  device.device = a["--device"];
  device.threads = std::stoi(a["--threads"]);
  auto backend = OpenBackend(device);
  if (!backend.ok()) return Fail(backend.status().message());
  auto model = Model::Load(a["--model"], *backend);
  if (!model.ok()) return Fail(model.status().message());
  auto tokenizer = Tokenizer::Load(a["--model"]);
  if (!tokenizer.ok()) return Fail(tokenizer.status().message());
  std::vector<int> layers;
  {
    std::stringstream s(a["--layers"]);
    std::string item;
    // Layer id i: transformers' hidden_states[i + 1], whose last entry is after the final norm
    // (Hidden's layers + 1), as the drafter reads them (model/dflash.cc).
    while (std::getline(s, item, ',')) {
      const int id = std::stoi(item);
      layers.push_back(id + 1 == (*model)->arch().layers ? (*model)->arch().layers + 1 : id + 1);
    }
  }
  const int64_t limit = std::stoll(a["--new"]);
  std::vector<std::vector<int32_t>> prompts;
  std::ifstream in(a["--prompts"]);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.contains("tokens")) {
      prompts.push_back(j["tokens"].get<std::vector<int32_t>>());
    } else {
      auto ids = tokenizer->Encode(j["prompt"].get<std::string>());
      if (!ids.ok()) return Fail(ids.status().message());
      prompts.push_back(*ids);
    }
  }
  EngineOptions options;
  options.slots = 32;
  options.context = 1024;
  options.rows = 512;
  options.kv_budget_bytes = int64_t{1} << 30;
  auto engine = Engine::Create(model->get(), options);
  if (!engine.ok()) return Fail(engine.status().message());
  std::vector<std::vector<int32_t>> answers(prompts.size());
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt = prompts[i];
    r.limit = limit;
    r.sampling.temperature = 0.0f;  // greedy: the tokens drafts are judged against
    auto id = (*engine)->Add(r);
    if (!id.ok()) return Fail(id.status().message());
    index[*id] = i;
  }
  while ((*engine)->Busy()) {
    auto progress = (*engine)->Advance();
    if (!progress.ok()) return Fail(progress.status().message());
    for (const Progress& p : *progress) {
      auto& t = answers[index.at(p.id)];
      t.insert(t.end(), p.tokens.begin(), p.tokens.end());
    }
  }
  engine->reset();
  std::ofstream out(a["--out"], std::ios::binary);
  const int32_t head[4] = {static_cast<int32_t>(layers.size()),
                           static_cast<int32_t>((*model)->arch().dim),
                           static_cast<int32_t>(prompts.size()), 0};
  out.write("DFD1", 4);
  out.write(reinterpret_cast<const char*>(head), 12);
  const int64_t dim = (*model)->arch().dim;
  int64_t total = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> tokens = prompts[i];
    tokens.insert(tokens.end(), answers[i].begin(), answers[i].end());
    const int64_t n = static_cast<int64_t>(tokens.size());
    const int32_t pages = static_cast<int32_t>(PagesFor(n) + 1);
    if (auto s = (*model)->AllocatePages(pages); !s.ok()) return Fail(s.message());
    if (auto s = (*model)->Reserve(n, 1, pages); !s.ok()) return Fail(s.message());
    std::vector<int32_t> table(pages);
    for (int32_t p = 0; p < pages; ++p) table[p] = p;
    Rows rows;
    for (int64_t r = 0; r < n; ++r) rows.Push(tokens[r], 0, r, false);
    std::vector<float> by_layer(layers.size() * n * dim);
    if (auto s = (*model)->Hidden(rows, {table.data(), 1, pages}, layers, by_layer.data());
        !s.ok()) {
      return Fail(s.message());
    }
    std::vector<uint16_t> f16(n * layers.size() * dim);
    for (int64_t r = 0; r < n; ++r) {
      for (size_t l = 0; l < layers.size(); ++l) {
        for (int64_t d = 0; d < dim; ++d) {
          f16[(r * layers.size() + l) * dim + d] = F32ToF16(by_layer[(l * n + r) * dim + d]);
        }
      }
    }
    const int32_t sizes[2] = {static_cast<int32_t>(n), static_cast<int32_t>(prompts[i].size())};
    out.write(reinterpret_cast<const char*>(sizes), 8);
    out.write(reinterpret_cast<const char*>(tokens.data()), n * 4);
    out.write(reinterpret_cast<const char*>(f16.data()), f16.size() * 2);
    total += n;
  }
  int64_t answers_total = 0;
  for (const auto& a : answers) answers_total += static_cast<int64_t>(a.size());
  std::fprintf(stderr, "dflash_data: %zu sequences, %lld tokens (%lld answer tokens) to %s\n",
               prompts.size(), static_cast<long long>(total),
               static_cast<long long>(answers_total), a["--out"].c_str());
  return out.good() ? 0 : Fail("could not write " + a["--out"]);
}

}  // namespace
}  // namespace gizllm

int main(int argc, char** argv) { return gizllm::Main(argc, argv); }
