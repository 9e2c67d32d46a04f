// gizllm rerank: scores of documents against a query, from a cross-encoder (an encoder with a
// sequence-classification head of one label) or a decoder answering yes or no (Qwen3-Reranker),
// highest first.
//   stdin: JSON lines, each a document (a JSON string); stdout: JSON lines
//   {"index": i, "relevance_score": s}, i counting stdin's lines from 0, best first.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "cli/model_options.h"
#include "cli/text_lines.h"

namespace gizllm::cli {

void AddRerankCommand(CLI::App& app, CommandContext& ctx) {
  auto* cmd = app.add_subcommand(
      "rerank",
      "Rank documents by their relevance to a query with a cross-encoder: stdin holds JSON "
      "lines of documents (JSON strings); stdout gets JSON lines {\"index\", "
      "\"relevance_score\"}, best first (equal scores in input order). The score is the head's "
      "logit under the model's activation (sentence-transformers' activation_fn; sigmoid by "
      "default); a pair longer than the model's positions is cut longest first. A decoder "
      "scores as Qwen3-Reranker: the pair in its prompt (with --instruction), then softmax over "
      "the last position's \"no\" and \"yes\" logits");
  struct Options {
    ModelOptions model;
    std::string query;
    int64_t top_n = 0;
    std::string instruction = EmbeddingModel::kRerankInstruction;
    bool verbose = false;
  };
  auto o = std::make_shared<Options>();
  o->model.Add(cmd);
  cmd->add_option("--query,-q", o->query, "The query every document is scored against")->required();
  cmd->add_option("--top-n", o->top_n, "Print only the best N (0: all)")
      ->default_val(0)
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--instruction", o->instruction,
                  "A decoder reranker's <Instruct> line (Qwen3-Reranker's prompt)")
      ->default_val(o->instruction);
  cmd->add_flag("--verbose,-v", o->verbose, "Print what was loaded on stderr");
  cmd->callback([&ctx, o] {
    auto model = o->model.LoadEmbedding(o->verbose);
    if (!model.ok()) return void(ctx.exit_code = Fail(model.status().message()));
    if ((*model)->is_decoder()) {
      if (Status s = (*model)->RerankByYesNo(o->instruction); !s.ok()) {
        return void(ctx.exit_code = Fail(s.message()));
      }
    }
    std::vector<Encoding> pairs;
    Status read = ForEachTextLine(std::cin, [&](const std::string& document) -> Status {
      GZ_ASSIGN_OR_RETURN(Encoding e, (*model)->TokenizePair(o->query, document));
      pairs.push_back(std::move(e));
      return Status::Ok();
    });
    if (!read.ok()) return void(ctx.exit_code = Fail(read.message()));
    auto scores = (*model)->Score(pairs);
    if (!scores.ok()) return void(ctx.exit_code = Fail(scores.status().message()));
    std::vector<size_t> order(scores->size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return (*scores)[a] > (*scores)[b]; });
    if (o->top_n > 0 && static_cast<size_t>(o->top_n) < order.size()) order.resize(o->top_n);
    std::string out;
    for (size_t i : order) {
      out += "{\"index\":" + std::to_string(i) +
             ",\"relevance_score\":" + FormatFloat((*scores)[i]) + "}\n";
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
  });
}

}  // namespace gizllm::cli
