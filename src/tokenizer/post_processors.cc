// Post-processors: TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel, Sequence.
#include <utility>

#include "tokenizer/components.h"

namespace gizllm::tok {
namespace {

class TemplateProcessor : public PostProcessor {
 public:
  // One template item: a sequence (0 = A, 1 = B) or the ids of a special token, and the token
  // type of its ids.
  struct Item {
    int sequence = -1;
    std::vector<int32_t> ids;
    int32_t type_id = 0;
  };
  TemplateProcessor(std::vector<Item> single, std::vector<Item> pair)
      : single_(std::move(single)), pair_(std::move(pair)) {}

  void Process(std::vector<std::vector<int32_t>>* sequences,
               std::vector<std::vector<int32_t>>* types, bool add_special) const override {
    if (!add_special) return;
    const auto& items = sequences->size() == 1 ? single_ : pair_;
    std::vector<int32_t> out, out_types;
    for (const Item& item : items) {
      if (item.sequence < 0) {
        out.insert(out.end(), item.ids.begin(), item.ids.end());
        out_types.insert(out_types.end(), item.ids.size(), item.type_id);
      } else if (item.sequence < static_cast<int>(sequences->size())) {
        const auto& s = (*sequences)[item.sequence];
        out.insert(out.end(), s.begin(), s.end());
        out_types.insert(out_types.end(), s.size(), item.type_id);
      }
    }
    sequences->assign(1, std::move(out));
    types->assign(1, std::move(out_types));
  }

 private:
  std::vector<Item> single_, pair_;
};

class SequenceProcessor : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> parts)
      : parts_(std::move(parts)) {}
  void Process(std::vector<std::vector<int32_t>>* sequences,
               std::vector<std::vector<int32_t>>* types, bool add_special) const override {
    for (const auto& p : parts_) p->Process(sequences, types, add_special);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

class NoOpProcessor : public PostProcessor {
 public:
  void Process(std::vector<std::vector<int32_t>>*, std::vector<std::vector<int32_t>>*,
               bool) const override {}
};

// A special token's id as a JSON value: an integer below `vocab_size`.
Expected<int32_t> ReadSpecialId(const Json& v, std::string_view token, int64_t vocab_size,
                                const std::string& where) {
  if (!v.is_number_integer()) return InvalidArgument("field '" + where + "': expected an integer");
  if ((!v.is_number_unsigned() && v.get<int64_t>() < 0) ||
      v.get<uint64_t>() >= static_cast<uint64_t>(vocab_size)) {
    return InvalidArgument("field '" + where + "': special token '" + std::string(token) +
                           "' has id " + v.dump() + ", outside the vocab of " +
                           std::to_string(vocab_size) + " ids");
  }
  return v.get<int32_t>();
}

// ["[SEP]", 102] -> 102.
Expected<int32_t> ReadTokenPair(const Json& j, const char* key, int64_t vocab_size,
                                const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_string() ||
      !(*it)[1].is_number_integer()) {
    return InvalidArgument("field '" + where + "." + key + "': expected [token, id]");
  }
  return ReadSpecialId((*it)[1], (*it)[0].get<std::string>(), vocab_size,
                       where + "." + key + "[1]");
}

// A template item's "type_id": a small non-negative integer (absent: 0).
Expected<int32_t> ReadTypeId(const Json& item, const std::string& where) {
  auto it = item.find("type_id");
  if (it == item.end() || it->is_null()) return 0;
  if (!it->is_number_unsigned() || it->get<uint64_t>() > 255)
    return InvalidArgument("field '" + where + ".type_id': expected an integer in [0, 255]");
  return it->get<int32_t>();
}

Expected<std::vector<TemplateProcessor::Item>> ReadTemplate(const Json& j, const char* key,
                                                            const Json& specials,
                                                            int64_t vocab_size,
                                                            const std::string& where) {
  std::string field = where + "." + key;
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) {
    return InvalidArgument("field '" + field + "': expected an array");
  }
  std::vector<TemplateProcessor::Item> items;
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& e = (*it)[i];
    std::string at = field + "[" + std::to_string(i) + "]";
    TemplateProcessor::Item item;
    if (auto s = e.find("Sequence"); s != e.end()) {
      std::string id = s->value("id", "");
      if (id != "A" && id != "B") return InvalidArgument("field '" + at + "': expected id A or B");
      item.sequence = id == "A" ? 0 : 1;
      GZ_ASSIGN_OR_RETURN(item.type_id, ReadTypeId(*s, at + ".Sequence"));
    } else if (auto t = e.find("SpecialToken"); t != e.end()) {
      std::string id = t->value("id", "");
      GZ_ASSIGN_OR_RETURN(item.type_id, ReadTypeId(*t, at + ".SpecialToken"));
      auto sp = specials.find(id);
      if (sp == specials.end() || !sp->contains("ids") || !(*sp)["ids"].is_array()) {
        return InvalidArgument("field '" + at + "': special token '" + id +
                               "' is not in special_tokens");
      }
      const Json& ids = (*sp)["ids"];
      for (size_t k = 0; k < ids.size(); ++k) {
        GZ_ASSIGN_OR_RETURN(int32_t token_id, ReadSpecialId(ids[k], id, vocab_size,
                                                            where + ".special_tokens." + id +
                                                                ".ids[" + std::to_string(k) + "]"));
        item.ids.push_back(token_id);
      }
    } else {
      return InvalidArgument("field '" + at + "': expected Sequence or SpecialToken");
    }
    items.push_back(std::move(item));
  }
  return items;
}

// `parts` in order, each with its token type; an empty part stands for the next sequence (A,
// then B).
std::vector<TemplateProcessor::Item> Items(
    std::initializer_list<std::pair<std::vector<int32_t>, int32_t>> parts) {
  std::vector<TemplateProcessor::Item> items;
  int next = 0;
  for (const auto& [ids, type_id] : parts) {
    TemplateProcessor::Item item;
    if (ids.empty()) {
      item.sequence = next++;
    } else {
      item.ids = ids;
    }
    item.type_id = type_id;
    items.push_back(std::move(item));
  }
  return items;
}

}  // namespace

Expected<std::unique_ptr<PostProcessor>> MakePostProcessor(const Json& j, int64_t vocab_size,
                                                           const std::string& where, int depth) {
  if (j.is_null()) return std::unique_ptr<PostProcessor>();
  std::string type = TypeOf(j);
  if (type == "ByteLevel") return std::unique_ptr<PostProcessor>(new NoOpProcessor());
  if (type == "TemplateProcessing") {
    // A reference, not a copy: copying a JSON value recurses as deep as it nests.
    static const Json kNoSpecials = Json::object();
    auto found = j.find("special_tokens");
    const Json& specials = found != j.end() ? *found : kNoSpecials;
    GZ_ASSIGN_OR_RETURN(auto single, ReadTemplate(j, "single", specials, vocab_size, where));
    GZ_ASSIGN_OR_RETURN(auto pair, ReadTemplate(j, "pair", specials, vocab_size, where));
    return std::unique_ptr<PostProcessor>(
        new TemplateProcessor(std::move(single), std::move(pair)));
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    GZ_ASSIGN_OR_RETURN(int32_t sep, ReadTokenPair(j, "sep", vocab_size, where));
    GZ_ASSIGN_OR_RETURN(int32_t cls, ReadTokenPair(j, "cls", vocab_size, where));
    // BERT's second text and its [SEP] are type 1; RoBERTa's tokens are all type 0.
    auto single = Items({{{cls}, 0}, {{}, 0}, {{sep}, 0}});
    auto pair = type == "BertProcessing"
                    ? Items({{{cls}, 0}, {{}, 0}, {{sep}, 0}, {{}, 1}, {{sep}, 1}})
                    : Items({{{cls}, 0}, {{}, 0}, {{sep}, 0}, {{sep}, 0}, {{}, 0}, {{sep}, 0}});
    return std::unique_ptr<PostProcessor>(
        new TemplateProcessor(std::move(single), std::move(pair)));
  }
  if (type == "Sequence") {
    GZ_RETURN_IF_ERROR(CheckSequenceDepth(depth, where));
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) {
      return InvalidArgument("field '" + where + ".processors': expected an array");
    }
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (size_t i = 0; i < it->size(); ++i) {
      GZ_ASSIGN_OR_RETURN(
          auto part,
          MakePostProcessor((*it)[i], vocab_size, where + ".processors[" + std::to_string(i) + "]",
                            depth + 1));
      if (part) parts.push_back(std::move(part));
    }
    return std::unique_ptr<PostProcessor>(new SequenceProcessor(std::move(parts)));
  }
  if (type.empty()) return InvalidArgument("field '" + where + ".type': expected a string");
  return Unimplemented("field '" + where + ".type': unknown post-processor type '" + type + "'");
}

}  // namespace gizllm::tok
