// gizllm logits: the logits of every position of a sequence of ids, as a NumPy .npy file.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/model_options.h"
#include "model/evaluate.h"

namespace gizllm::cli {
namespace {

Expected<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX)
      return InvalidArgument("--ids: '" + item + "' is not a token id");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return InvalidArgument("--ids: no token ids");
  return ids;
}

// NumPy format 1.0: magic, header length, a Python dict literal padded to 64 bytes.
Status WriteNpy(const std::string& path, const std::vector<float>& data, int64_t rows,
                int64_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                       std::to_string(rows) + ", " + std::to_string(cols) + "), }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream out(path, std::ios::binary);
  if (!out) return NotFound(path + ": cannot create");
  out.write("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  out.write(reinterpret_cast<const char*>(&len), 2);
  out.write(header.data(), header.size());
  out.write(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(float));
  if (!out) return DataLoss(path + ": write failed");
  return Status::Ok();
}

}  // namespace

void AddLogitsCommand(CLI::App& app, CommandContext& ctx) {
  auto* cmd =
      app.add_subcommand("logits", "Write the logits of every position as .npy [tokens, vocab]");
  struct Options {
    ModelOptions model;
    std::string ids, out;
    bool mtp = false;
  };
  auto o = std::make_shared<Options>();
  o->model.Add(cmd);
  cmd->add_option("--ids", o->ids, "Comma-separated token ids, e.g. 1,2,3")->required();
  cmd->add_option("--out,-o", o->out, "Output .npy file")->required();
  cmd->add_flag("--mtp", o->mtp,
                "Write the MTP layer's logits instead, [tokens - 1, vocab]: row t reads token "
                "t + 1 and the model's hidden state at t, and predicts token t + 2");
  cmd->callback([&ctx, o] {
    auto tokens = ParseIds(o->ids);
    if (!tokens.ok()) return void(ctx.exit_code = Fail(tokens.status().message()));
    auto m = o->model.Load(false);
    if (!m.ok()) return void(ctx.exit_code = Fail(m.status().message()));
    auto logits = o->mtp ? SequenceMtpLogits(**m, *tokens) : SequenceLogits(**m, *tokens);
    if (!logits.ok()) return void(ctx.exit_code = Fail(logits.status().message()));
    const int64_t rows = static_cast<int64_t>(tokens->size()) - (o->mtp ? 1 : 0);
    Status s = WriteNpy(o->out, *logits, rows, (*m)->arch().vocab);
    if (!s.ok()) return void(ctx.exit_code = Fail(s.message()));
  });
}

}  // namespace gizllm::cli
