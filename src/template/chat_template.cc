#include "template/chat_template.h"

#include <tuple>

#include "core/mapped_file.h"
#include "formats/bitgpu_files.h"
#include "formats/gguf.h"

namespace gizllm {

namespace {

using nlohmann::ordered_json;

// A special token in tokenizer_config.json: a string or an AddedToken {"content": ...}.
bool ReadToken(const ordered_json& config, const char* key, std::string& out) {
  auto it = config.find(key);
  if (it == config.end()) return false;
  if (it->is_string()) {
    out = it->get<std::string>();
    return true;
  }
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    out = (*it)["content"].get<std::string>();
    return true;
  }
  return false;
}

Expected<std::shared_ptr<const jinja::Template>> Compile(const std::string& source,
                                                         const std::string& origin) {
  Expected<jinja::Template> t = jinja::Template::Parse(source);
  if (!t.ok()) return t.status().Annotate(origin);
  return std::make_shared<const jinja::Template>(std::move(*t));
}

}  // namespace

Expected<ChatTemplate> ChatTemplate::FromString(std::string source, std::string bos,
                                                std::string eos) {
  ChatTemplate t;
  GZ_ASSIGN_OR_RETURN(t.default_, Compile(source, t.origin_));
  t.source_ = std::move(source);
  t.has_bos_ = !bos.empty();
  t.has_eos_ = !eos.empty();
  t.bos_ = std::move(bos);
  t.eos_ = std::move(eos);
  return t;
}

// tokenizer.chat_template (and tokenizer.chat_template.tool_use) of a GGUF file, with the texts
// of its bos and eos tokens.
Expected<ChatTemplate> ChatTemplate::LoadGguf(const std::string& path) {
  GZ_ASSIGN_OR_RETURN(GgufFile f, GgufFile::Open(path));
  if (!f.Find("tokenizer.chat_template")) {
    return NotFound(path + ": no metadata \"tokenizer.chat_template\"");
  }
  ChatTemplate t;
  GZ_ASSIGN_OR_RETURN(t.source_, f.GetString("tokenizer.chat_template"));
  t.origin_ = path + ": tokenizer.chat_template";
  GZ_ASSIGN_OR_RETURN(t.default_, Compile(t.source_, t.origin_));
  if (f.Find("tokenizer.chat_template.tool_use")) {
    GZ_ASSIGN_OR_RETURN(std::string tool_use, f.GetString("tokenizer.chat_template.tool_use"));
    GZ_ASSIGN_OR_RETURN(t.tool_use_, Compile(tool_use, t.origin_ + ".tool_use"));
  }
  const GgufValue* tokens = f.Find("tokenizer.ggml.tokens");
  for (auto [key, text, has] : {std::tuple{"tokenizer.ggml.bos_token_id", &t.bos_, &t.has_bos_},
                                std::tuple{"tokenizer.ggml.eos_token_id", &t.eos_, &t.has_eos_}}) {
    if (!f.Find(key)) continue;
    GZ_ASSIGN_OR_RETURN(uint64_t id, f.GetUint(key));
    if (!tokens || tokens->type != GgufType::kArray || id >= tokens->strings.size()) {
      return InvalidArgument(path + ": metadata \"" + key + "\" = " + std::to_string(id) +
                             " is not an id of tokenizer.ggml.tokens");
    }
    *text = tokens->strings[id];
    *has = true;
  }
  return t;
}

Expected<ChatTemplate> ChatTemplate::Load(const std::string& model_dir) {
  if (model_dir.ends_with(".gguf") && FileExists(model_dir)) return LoadGguf(model_dir);
  ChatTemplate t;
  const std::string config_path = model_dir + "/tokenizer_config.json";
  if (!FileExists(config_path) && !FileExists(model_dir + "/chat_template.jinja")) {
    // A bitgpu folder without them: its data file's metadata.
    const std::string gguf = BitgpuGgufDataFile(model_dir);
    if (!gguf.empty() && FileExists(gguf)) return LoadGguf(gguf);
  }
  ordered_json config = ordered_json::object();
  if (FileExists(config_path)) {
    GZ_ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
    config = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return DataLoss(config_path + ": not a JSON object");
    }
    t.has_bos_ = ReadToken(config, "bos_token", t.bos_);
    t.has_eos_ = ReadToken(config, "eos_token", t.eos_);
  }
  // transformers prefers chat_template.jinja to the template inside tokenizer_config.json.
  const std::string jinja_path = model_dir + "/chat_template.jinja";
  if (FileExists(jinja_path)) {
    GZ_ASSIGN_OR_RETURN(t.source_, ReadFile(jinja_path));
    t.origin_ = jinja_path;
    GZ_ASSIGN_OR_RETURN(t.default_, Compile(t.source_, t.origin_));
    return t;
  }
  if (!FileExists(config_path)) {
    return NotFound(model_dir + ": neither chat_template.jinja nor tokenizer_config.json exists");
  }
  t.origin_ = config_path + ": chat_template";
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return NotFound(config_path + ": no chat_template (and no chat_template.jinja beside it)");
  }
  if (it->is_string()) {
    t.source_ = it->get<std::string>();
    GZ_ASSIGN_OR_RETURN(t.default_, Compile(t.source_, t.origin_));
    return t;
  }
  if (!it->is_array()) {
    return InvalidArgument(config_path +
                           ": chat_template: expected a string or a list of {name, template}");
  }
  for (const auto& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("template") || !entry["template"].is_string()) {
      return InvalidArgument(config_path +
                             ": chat_template: each entry needs string fields "
                             "\"name\" and \"template\"");
    }
    const std::string name = entry["name"].get<std::string>();
    const std::string source = entry["template"].get<std::string>();
    if (name == "default") {
      t.source_ = source;
      GZ_ASSIGN_OR_RETURN(t.default_, Compile(source, t.origin_ + " \"default\""));
    } else if (name == "tool_use") {
      GZ_ASSIGN_OR_RETURN(t.tool_use_, Compile(source, t.origin_ + " \"tool_use\""));
    }
  }
  if (!t.default_) {
    return InvalidArgument(config_path + ": chat_template: no template named \"default\"");
  }
  return t;
}

const jinja::Template& ChatTemplate::Pick(bool has_tools) const {
  return has_tools && tool_use_ ? *tool_use_ : *default_;
}

Expected<std::string> ChatTemplate::Render(const ordered_json& input) const {
  if (!input.is_object()) return InvalidArgument("chat: expected a JSON object");
  auto messages = input.find("messages");
  if (messages == input.end() || !messages->is_array()) {
    return InvalidArgument("messages: expected a list of message objects");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    if (!(*messages)[i].is_object()) {
      return InvalidArgument("messages[" + std::to_string(i) + "]: expected an object");
    }
  }
  auto tools = input.find("tools");
  if (tools != input.end() && !tools->is_null() && !tools->is_array()) {
    return InvalidArgument("tools: expected a list of tool objects");
  }
  // The variables transformers passes: its special tokens, then the request's keys, with tools,
  // documents and add_generation_prompt always defined.
  jinja::Dict vars;
  if (has_bos_) vars.Set("bos_token", jinja::Value(bos_));
  if (has_eos_) vars.Set("eos_token", jinja::Value(eos_));
  vars.Set("tools", jinja::Value(jinja::None{}));
  vars.Set("documents", jinja::Value(jinja::None{}));
  vars.Set("add_generation_prompt", jinja::Value(false));
  for (const auto& [key, value] : input.items()) vars.Set(key, jinja::Value::FromJson(value));
  bool has_tools = tools != input.end() && !tools->is_null();
  Expected<std::string> out = Pick(has_tools).Render(vars);
  if (!out.ok()) return out.status().Annotate(origin_);
  return out;
}

Expected<RenderedChat> ChatTemplate::RenderWithOffsets(const ordered_json& input,
                                                       size_t last_messages) const {
  RenderedChat chat;
  GZ_ASSIGN_OR_RETURN(chat.prompt, Render(input));
  const ordered_json& messages = input["messages"];
  auto prefix_end = [&](const ordered_json& partial) -> long {
    Expected<std::string> r = Render(partial);
    if (!r.ok() || r->size() > chat.prompt.size()) return -1;
    if (chat.prompt.compare(0, r->size(), *r) != 0) return -1;
    return static_cast<long>(r->size());
  };
  // Each prefix of the chat, rendered without a generation prompt, shares its start with the
  // full render unless the template treats the last message specially.
  ordered_json partial = input;
  partial["add_generation_prompt"] = false;
  partial["messages"] = ordered_json::array();
  const size_t first = messages.size() > last_messages ? messages.size() - last_messages : 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    partial["messages"].push_back(messages[i]);
    chat.message_ends.push_back(i >= first ? prefix_end(partial) : -1);
  }
  auto tools = input.find("tools");
  if (tools != input.end() && tools->is_array() && !tools->empty()) {
    partial["messages"] = ordered_json::array();
    if (!messages.empty() && messages[0].is_object() && messages[0].value("role", "") == "system") {
      partial["messages"].push_back(messages[0]);
    }
    chat.shared_end = prefix_end(partial);
  }
  return chat;
}

}  // namespace gizllm
