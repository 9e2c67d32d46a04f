#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "grammar/regex.h"

namespace gizllm {
namespace {

using Json = nlohmann::ordered_json;

// Integers stay below 10^16 (exact in a double).
constexpr int64_t kIntegerCap = 9999999999999999;
constexpr int kMaxDepth = 128;  // nesting of schemas followed without a $ref

// The rules every schema may use, written once on demand.
const std::map<std::string, std::string>& Primitives() {
  static const auto* p = new std::map<std::string, std::string>{
      {"sp", "\" \"?"},
      {"hex", "[0-9a-fA-F]"},
      // \u escapes of surrogates are left out: a pair counts as one character for the schema.
      {"char",
       R"([^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" ([0-9a-cA-CeEfF] hex hex hex | [dD] [0-7] hex hex)))"},
      {"string", R"("\"" char* "\"")"},
      {"integer", R"("-"? ("0" | [1-9] [0-9]{0,15}))"},
      {"number", R"("-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,15})? ([eE] [-+]? [0-9]{1,2})?)"},
      {"boolean", R"("true" | "false")"},
      {"null", R"("null")"},
      {"value", R"(object | array | string | number | boolean | null)"},
      {"object", R"("{" (string ":" sp value ("," sp string ":" sp value)*)? "}")"},
      {"array", R"("[" (value ("," sp value)*)? "]")"},
      {"date",
       R"([0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | "1" [0-9] | "2" [0-8]) | [0-9]{4} "-" ("0" [13-9] | "1" [0-2]) "-" ("29" | "30") | [0-9]{4} "-" ("0" [13578] | "1" [02]) "-31")"},
      {"time",
       R"(("0" [0-9] | "1" [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ("0" [0-9] | "1" [0-9] | "2" [0-3]) ":" [0-5] [0-9]))"},
      {"date-time", R"(date "T" time)"},
      {"uuid", R"(hex{8} "-" hex{4} "-" hex{4} "-" hex{4} "-" hex{12})"},
      // Bounded: at most 4 atoms of 16 characters before the @ and 4 labels of 16 after it.
      {"email-atom", R"([a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]{1,16})"},
      {"email-label", R"([a-zA-Z0-9] ([a-zA-Z0-9-]{0,14} [a-zA-Z0-9])?)"},
      {"email", R"(email-atom ("." email-atom){0,3} "@" (email-label "."){1,3} email-label)"},
  };
  return *p;
}

// What each primitive uses.
const std::map<std::string, std::vector<std::string>>& Uses() {
  static const auto* u = new std::map<std::string, std::vector<std::string>>{
      {"char", {"hex"}},
      {"string", {"char"}},
      {"value", {"object", "array", "string", "number", "boolean", "null"}},
      {"object", {"string", "sp", "value"}},
      {"array", {"value", "sp"}},
      {"date-time", {"date", "time"}},
      {"uuid", {"hex"}},
      {"email", {"email-atom", "email-label"}},
  };
  return *u;
}

std::string Digits(int64_t v) { return std::to_string(v); }

// Digit strings a..b of equal length, a <= b.
std::string DigitRange(const std::string& a, const std::string& b) {
  if (a.size() == 1) return a == b ? GbnfLiteral(a) : "[" + a + "-" + b + "]";
  if (a[0] == b[0]) return GbnfLiteral(a.substr(0, 1)) + " " + DigitRange(a.substr(1), b.substr(1));
  const size_t rest = a.size() - 1;
  const std::string tail_a = a.substr(1), tail_b = b.substr(1);
  std::vector<std::string> alts;
  char lo = a[0], hi = b[0];
  if (tail_a != std::string(rest, '0')) {
    alts.push_back(GbnfLiteral(a.substr(0, 1)) + " (" + DigitRange(tail_a, std::string(rest, '9')) +
                   ")");
    ++lo;
  }
  std::string top;
  if (tail_b != std::string(rest, '9')) {
    top = GbnfLiteral(b.substr(0, 1)) + " (" + DigitRange(std::string(rest, '0'), tail_b) + ")";
    --hi;
  }
  if (lo <= hi) {
    alts.push_back(
        (lo == hi ? GbnfLiteral(std::string(1, lo)) : "[" + std::string(1, lo) + "-" + hi + "]") +
        " [0-9]{" + std::to_string(rest) + "}");
  }
  if (!top.empty()) alts.push_back(top);
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return alts.size() == 1 ? out : "(" + out + ")";
}

// Non-negative integers a..b, without leading zeros.
std::string NonNegativeRange(int64_t a, int64_t b) {
  std::vector<std::string> alts;
  const std::string sa = Digits(a), sb = Digits(b);
  for (size_t len = sa.size(); len <= sb.size(); ++len) {
    int64_t p = 1;
    for (size_t i = 1; i < len; ++i) p *= 10;
    const int64_t lo = len == sa.size() ? a : p;
    const int64_t hi = len == sb.size() ? b : p * 10 - 1;
    alts.push_back(DigitRange(Digits(lo), Digits(hi)));
  }
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return "(" + out + ")";
}

// Integers lo..hi.
std::string IntegerRange(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  if (lo < 0) alts.push_back("\"-\" " + NonNegativeRange(hi < 0 ? -hi : 1, -lo));
  if (hi >= 0) alts.push_back(NonNegativeRange(std::max<int64_t>(lo, 0), hi));
  std::string out;
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return "(" + out + ")";
}

std::string PointerEscape(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

bool IsAnnotation(const std::string& k) {
  static const std::set<std::string> kAnnotations = {
      "title",     "description", "default", "examples", "$comment", "deprecated", "readOnly",
      "writeOnly", "$schema",     "$id",     "$anchor",  "strict",   "name"};
  return kAnnotations.count(k) > 0;
}

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const Json& root) : root_(root) {}

  Expected<std::string> Run() {
    GZ_ASSIGN_OR_RETURN(std::string body, Visit(root_, "#", 0));
    std::string out = "root ::= " + body + "\n";
    for (const std::string& name : order_) out += name + " ::= " + rules_[name] + "\n";
    return out;
  }

 private:
  Status Refuse(const std::string& path, const std::string& what) const {
    return InvalidArgument("json schema " + path + ": " + what);
  }

  std::string Use(const std::string& primitive) {
    if (rules_.count(primitive) == 0) {
      rules_[primitive] = Primitives().at(primitive);
      order_.push_back(primitive);
      if (auto it = Uses().find(primitive); it != Uses().end()) {
        for (const std::string& u : it->second) Use(u);
      }
    }
    return primitive;
  }

  std::string NewRule(const std::string& hint, const std::string& body) {
    std::string name;
    for (char c : hint) {
      name += (std::isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '-';
    }
    if (name.empty() || name.size() > 40) name = "r";
    std::string unique = name;
    for (int k = 2; rules_.count(unique) || Primitives().count(unique) || unique == "root"; ++k) {
      unique = name + std::to_string(k);
    }
    rules_[unique] = body;
    order_.push_back(unique);
    return unique;
  }

  // Follows a JSON pointer "#/a/b" into the document.
  Expected<const Json*> Resolve(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#') {
      return Refuse(path + "/$ref", "only references into this document (#...) are supported");
    }
    const Json* node = &root_;
    size_t i = 1;
    while (i < ref.size()) {
      if (ref[i] != '/') return Refuse(path + "/$ref", "not a JSON pointer: " + ref);
      size_t j = ref.find('/', i + 1);
      if (j == std::string::npos) j = ref.size();
      std::string key;
      for (size_t k = i + 1; k < j; ++k) {
        if (ref[k] == '~' && k + 1 < j) {
          key += ref[k + 1] == '1' ? '/' : '~';
          ++k;
        } else {
          key += ref[k];
        }
      }
      if (node->is_object() && node->contains(key)) {
        node = &(*node)[key];
      } else if (node->is_array() && !key.empty() &&
                 key.find_first_not_of("0123456789") == std::string::npos &&
                 std::stoul(key) < node->size()) {
        node = &(*node)[std::stoul(key)];
      } else {
        return Refuse(path + "/$ref", "no such place: " + ref);
      }
      i = j;
    }
    return node;
  }

  Expected<std::string> Visit(const Json& s, const std::string& path, int depth) {
    if (depth > kMaxDepth) return Refuse(path, "nested deeper than " + std::to_string(kMaxDepth));
    if (s.is_boolean()) {
      if (s.get<bool>()) return Use("value");
      return Refuse(path, "the schema false accepts nothing");
    }
    if (!s.is_object()) return Refuse(path, "expected a schema (an object or a boolean)");
    static const std::set<std::string> kKnown = {"type",
                                                 "properties",
                                                 "required",
                                                 "additionalProperties",
                                                 "enum",
                                                 "const",
                                                 "anyOf",
                                                 "oneOf",
                                                 "allOf",
                                                 "$ref",
                                                 "$defs",
                                                 "definitions",
                                                 "items",
                                                 "prefixItems",
                                                 "minItems",
                                                 "maxItems",
                                                 "minLength",
                                                 "maxLength",
                                                 "format",
                                                 "pattern",
                                                 "minimum",
                                                 "maximum",
                                                 "exclusiveMinimum",
                                                 "exclusiveMaximum",
                                                 "uniqueItems"};
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (!kKnown.count(it.key()) && !IsAnnotation(it.key())) {
        return Refuse(path + "/" + PointerEscape(it.key()), "unsupported keyword");
      }
    }
    if (s.contains("uniqueItems") && s["uniqueItems"] != false) {
      return Refuse(path + "/uniqueItems", "unsupported keyword");
    }
    auto others = [&](std::initializer_list<const char*> allowed) -> Status {
      for (auto it = s.begin(); it != s.end(); ++it) {
        const std::string& k = it.key();
        if (IsAnnotation(k) || k == "$defs" || k == "definitions") continue;
        if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; }) ==
            allowed.end()) {
          return Refuse(path + "/" + PointerEscape(k),
                        "not supported beside the keyword " + std::string(*allowed.begin()));
        }
      }
      return Status::Ok();
    };
    if (s.contains("$ref")) {
      GZ_RETURN_IF_ERROR(others({"$ref"}));
      if (!s["$ref"].is_string()) return Refuse(path + "/$ref", "expected a string");
      const std::string ref = s["$ref"].get<std::string>();
      if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
      GZ_ASSIGN_OR_RETURN(const Json* target, Resolve(ref, path));
      // The rule is named before its body is compiled, so that recursion refers to it.
      const std::string name = NewRule(ref == "#" ? "doc" : ref.substr(ref.rfind('/') + 1), "");
      refs_[ref] = name;
      GZ_ASSIGN_OR_RETURN(std::string body, Visit(*target, ref, 0));
      rules_[name] = body;
      return name;
    }
    if (s.contains("const") || s.contains("enum")) {
      GZ_RETURN_IF_ERROR(others({s.contains("const") ? "const" : "enum", "type", "const", "enum"}));
      std::vector<Json> values;
      if (s.contains("const")) values.push_back(s["const"]);
      if (s.contains("enum")) {
        if (!s["enum"].is_array() || s["enum"].empty()) {
          return Refuse(path + "/enum", "expected a non-empty array");
        }
        for (const Json& v : s["enum"]) {
          if (!s.contains("const") || v == s["const"]) values.push_back(v);
        }
        if (s.contains("const")) values.resize(std::min<size_t>(values.size(), 1));
      }
      std::vector<std::string> alts;
      for (const Json& v : values) {
        if (s.contains("type") && !TypeAccepts(s["type"], v)) continue;
        alts.push_back(GbnfLiteral(v.dump()));
      }
      if (alts.empty()) return Refuse(path, "no value of enum/const has the schema's type");
      return Join(alts);
    }
    if (s.contains("anyOf") || s.contains("oneOf")) {
      const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
      GZ_RETURN_IF_ERROR(others({key}));
      const Json& branches = s[key];
      if (!branches.is_array() || branches.empty()) {
        return Refuse(path + "/" + key, "expected a non-empty array");
      }
      std::vector<std::string> alts;
      for (size_t i = 0; i < branches.size(); ++i) {
        GZ_ASSIGN_OR_RETURN(
            std::string b,
            Visit(branches[i], path + "/" + key + "/" + std::to_string(i), depth + 1));
        alts.push_back(b);
      }
      if (std::string(key) == "oneOf") {
        for (size_t i = 0; i < branches.size(); ++i) {
          for (size_t j = i + 1; j < branches.size(); ++j) {
            if (!Disjoint(branches[i], branches[j])) {
              return Refuse(path + "/oneOf", "branches " + std::to_string(i) + " and " +
                                                 std::to_string(j) +
                                                 " may both match (oneOf needs branches told "
                                                 "apart by type, or by a const property)");
            }
          }
        }
      }
      return NewRule(Hint(path), Join(alts));
    }
    if (s.contains("allOf")) {
      GZ_RETURN_IF_ERROR(others({"allOf"}));
      GZ_ASSIGN_OR_RETURN(Json merged, MergeAllOf(s["allOf"], path + "/allOf"));
      return Visit(merged, path + "/allOf", depth + 1);
    }
    // The type: given, or read from the keywords.
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const Json& x : t) {
          if (!x.is_string()) return Refuse(path + "/type", "expected type names");
          types.push_back(x.get<std::string>());
        }
      } else {
        return Refuse(path + "/type", "expected a type name or a list of them");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") ||
               s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") ||
               s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("format") ||
               s.contains("pattern")) {
      types.push_back("string");
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum")) {
      types.push_back("number");
    } else {
      return Use("value");
    }
    std::vector<std::string> alts;
    for (const std::string& t : types) {
      GZ_ASSIGN_OR_RETURN(std::string b, Typed(s, t, path, depth));
      alts.push_back(b);
    }
    return alts.size() == 1 ? alts[0] : NewRule(Hint(path), Join(alts));
  }

  static std::string Join(const std::vector<std::string>& alts) {
    std::string out;
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return alts.size() == 1 ? out : "(" + out + ")";
  }

  static std::string Hint(const std::string& path) {
    const size_t slash = path.rfind('/');
    std::string h = slash == std::string::npos ? path : path.substr(slash + 1);
    if (h == "#" || h.empty()) h = "doc";
    if (!h.empty() && std::isdigit(static_cast<unsigned char>(h[0]))) h = "item" + h;
    return h;
  }

  static bool TypeAccepts(const Json& type, const Json& v) {
    auto one = [&](const std::string& t) {
      if (t == "string") return v.is_string();
      if (t == "integer")
        return v.is_number_integer() ||
               (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
      if (t == "number") return v.is_number();
      if (t == "boolean") return v.is_boolean();
      if (t == "null") return v.is_null();
      if (t == "object") return v.is_object();
      if (t == "array") return v.is_array();
      return false;
    };
    if (type.is_string()) return one(type.get<std::string>());
    if (type.is_array()) {
      for (const Json& t : type) {
        if (t.is_string() && one(t.get<std::string>())) return true;
      }
    }
    return false;
  }

  // The JSON types a branch can produce, as a bit set (object 1, array 2, string 4, number 8,
  // boolean 16, null 32; integer counts as number); 0: unknown.
  int Kinds(const Json& s) {
    if (!s.is_object()) return 0;
    if (s.contains("$ref") && s["$ref"].is_string()) {
      Expected<const Json*> t = Resolve(s["$ref"].get<std::string>(), "#");
      return t.ok() && ++kinds_depth_ < 32 ? Kinds(**t) : 0;
    }
    auto kind_of = [](const std::string& t) {
      return t == "object"                       ? 1
             : t == "array"                      ? 2
             : t == "string"                     ? 4
             : (t == "number" || t == "integer") ? 8
             : t == "boolean"                    ? 16
             : t == "null"                       ? 32
                                                 : 0;
    };
    auto value_kind = [](const Json& v) {
      return v.is_object()    ? 1
             : v.is_array()   ? 2
             : v.is_string()  ? 4
             : v.is_number()  ? 8
             : v.is_boolean() ? 16
                              : 32;
    };
    if (s.contains("const")) return value_kind(s["const"]);
    int k = 0;
    if (s.contains("enum") && s["enum"].is_array()) {
      for (const Json& v : s["enum"]) k |= value_kind(v);
      return k;
    }
    if (s.contains("type")) {
      if (s["type"].is_string()) return kind_of(s["type"].get<std::string>());
      if (s["type"].is_array()) {
        for (const Json& t : s["type"]) k |= t.is_string() ? kind_of(t.get<std::string>()) : 0;
      }
      return k;
    }
    if (s.contains("properties")) return 1;
    return 0;
  }

  // Values of a property fixed by const or enum; empty: not fixed.
  static std::vector<Json> Fixed(const Json& s) {
    if (!s.is_object()) return {};
    if (s.contains("const")) return {s["const"]};
    if (s.contains("enum") && s["enum"].is_array()) return s["enum"].get<std::vector<Json>>();
    return {};
  }

  // Whether no value matches both branches (a conservative check).
  bool Disjoint(const Json& a0, const Json& b0) {
    kinds_depth_ = 0;
    const int ka = Kinds(a0), kb = Kinds(b0);
    if (ka != 0 && kb != 0 && (ka & kb) == 0) return true;
    // Enums and consts with no value in common.
    std::vector<Json> fa = Fixed(a0), fb = Fixed(b0);
    if (!fa.empty() && !fb.empty()) {
      for (const Json& x : fa) {
        if (std::find(fb.begin(), fb.end(), x) != fb.end()) return false;
      }
      return true;
    }
    const Json* a = &a0;
    const Json* b = &b0;
    for (const Json** p : {&a, &b}) {
      if ((*p)->is_object() && (*p)->contains("$ref") && (**p)["$ref"].is_string()) {
        Expected<const Json*> t = Resolve((**p)["$ref"].get<std::string>(), "#");
        if (!t.ok()) return false;
        *p = *t;
      }
    }
    if (!a->is_object() || !b->is_object() || (ka | kb) != 1) return false;
    auto required = [](const Json& s) {
      std::set<std::string> r;
      if (s.contains("required") && s["required"].is_array()) {
        for (const Json& k : s["required"]) {
          if (k.is_string()) r.insert(k.get<std::string>());
        }
      }
      return r;
    };
    const std::set<std::string> ra = required(*a), rb = required(*b);
    // A property both require, fixed to values no two share.
    for (const std::string& k : ra) {
      if (!rb.count(k) || !a->contains("properties") || !b->contains("properties") ||
          !(*a)["properties"].is_object() || !(*b)["properties"].is_object()) {
        continue;
      }
      std::vector<Json> va = Fixed((*a)["properties"].value(k, Json())),
                        vb = Fixed((*b)["properties"].value(k, Json()));
      if (va.empty() || vb.empty()) continue;
      bool shared = false;
      for (const Json& x : va) shared = shared || std::find(vb.begin(), vb.end(), x) != vb.end();
      if (!shared) return true;
    }
    // A key one requires that the other refuses (additionalProperties false, not listed).
    auto refuses = [](const Json& s, const std::string& k) {
      return s.contains("additionalProperties") && s["additionalProperties"] == false &&
             (!s.contains("properties") || !s["properties"].contains(k));
    };
    for (const std::string& k : ra) {
      if (refuses(*b, k)) return true;
    }
    for (const std::string& k : rb) {
      if (refuses(*a, k)) return true;
    }
    return false;
  }

  Expected<Json> MergeAllOf(const Json& branches, const std::string& path) {
    if (!branches.is_array() || branches.empty()) return Refuse(path, "expected a non-empty array");
    if (branches.size() == 1) return branches[0];
    Json merged = {{"type", "object"}, {"properties", Json::object()}, {"required", Json::array()}};
    int closed = 0, with_properties = 0;
    for (size_t i = 0; i < branches.size(); ++i) {
      const std::string at = path + "/" + std::to_string(i);
      const Json* b = &branches[i];
      if (b->is_object() && b->contains("$ref")) {
        if (!(*b)["$ref"].is_string()) return Refuse(at + "/$ref", "expected a string");
        GZ_ASSIGN_OR_RETURN(b, Resolve((*b)["$ref"].get<std::string>(), at));
      }
      if (!b->is_object()) return Refuse(at, "allOf merges object schemas only");
      for (auto it = b->begin(); it != b->end(); ++it) {
        const std::string& k = it.key();
        if (IsAnnotation(k)) continue;
        if (k == "type") {
          if (it.value() != "object")
            return Refuse(at + "/type", "allOf merges object schemas only");
        } else if (k == "properties") {
          if (!it.value().is_object()) return Refuse(at + "/properties", "expected an object");
          if (!it.value().empty()) ++with_properties;
          for (auto p = it.value().begin(); p != it.value().end(); ++p) {
            if (merged["properties"].contains(p.key())) {
              return Refuse(at + "/properties/" + PointerEscape(p.key()),
                            "a property two branches of allOf both define");
            }
            merged["properties"][p.key()] = p.value();
          }
        } else if (k == "required") {
          if (!it.value().is_array()) return Refuse(at + "/required", "expected an array");
          for (const Json& r : it.value()) merged["required"].push_back(r);
        } else if (k == "additionalProperties") {
          if (it.value() != false) {
            return Refuse(at + "/additionalProperties",
                          "allOf merges only additionalProperties false");
          }
          ++closed;
        } else {
          return Refuse(at + "/" + PointerEscape(k), "allOf merges object schemas only");
        }
      }
    }
    // A branch closed to other properties refuses those the other branches add.
    if (closed > 0 && with_properties > 1) {
      return Refuse(path,
                    "a branch with additionalProperties false beside others that add properties");
    }
    if (closed > 0) merged["additionalProperties"] = false;
    return merged;
  }

  Expected<std::string> Typed(const Json& s, const std::string& type, const std::string& path,
                              int depth) {
    auto number_of = [&](const char* key, double* out) -> Status {
      if (!s.contains(key)) return Status::Ok();
      if (!s[key].is_number()) return Refuse(path + "/" + key, "expected a number");
      *out = s[key].get<double>();
      return Status::Ok();
    };
    if (type == "string") {
      const bool has_format = s.contains("format"), has_pattern = s.contains("pattern");
      const bool has_length = s.contains("minLength") || s.contains("maxLength");
      if (has_format + has_pattern + has_length > 1) {
        return Refuse(path, "format, pattern and minLength/maxLength together are not supported");
      }
      if (has_format) {
        static const std::set<std::string> kFormats = {"date", "time", "date-time", "uuid",
                                                       "email"};
        if (!s["format"].is_string() || !kFormats.count(s["format"].get<std::string>())) {
          return Refuse(path + "/format", "unsupported format " + s["format"].dump() +
                                              " (supported: date, time, date-time, uuid, email)");
        }
        return NewRule(Hint(path), "\"\\\"\" " + Use(s["format"].get<std::string>()) + " \"\\\"\"");
      }
      if (has_pattern) {
        if (!s["pattern"].is_string()) return Refuse(path + "/pattern", "expected a string");
        Use("char");
        GZ_ASSIGN_OR_RETURN(std::string body, JsonStringPatternGbnf(s["pattern"].get<std::string>(),
                                                                    path + "/pattern"));
        return NewRule(Hint(path), body);
      }
      if (has_length) {
        double lo = 0, hi = -1;
        GZ_RETURN_IF_ERROR(number_of("minLength", &lo));
        GZ_RETURN_IF_ERROR(number_of("maxLength", &hi));
        if (lo < 0 || (s.contains("maxLength") && hi < lo) || lo > 65536 || hi > 65536) {
          return Refuse(path, "minLength/maxLength out of order or above 65536");
        }
        Use("char");
        const std::string count = s.contains("maxLength")
                                      ? "{" + Digits(static_cast<int64_t>(lo)) + "," +
                                            Digits(static_cast<int64_t>(hi)) + "}"
                                      : "{" + Digits(static_cast<int64_t>(lo)) + ",}";
        return NewRule(Hint(path), "\"\\\"\" char" + count + " \"\\\"\"");
      }
      return Use("string");
    }
    if (type == "integer" || type == "number") {
      const bool bounded = s.contains("minimum") || s.contains("maximum") ||
                           s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum");
      if (!bounded) return Use(type);
      double lo = -1e300, hi = 1e300, xlo = -1e300, xhi = 1e300;
      GZ_RETURN_IF_ERROR(number_of("minimum", &lo));
      GZ_RETURN_IF_ERROR(number_of("maximum", &hi));
      GZ_RETURN_IF_ERROR(number_of("exclusiveMinimum", &xlo));
      GZ_RETURN_IF_ERROR(number_of("exclusiveMaximum", &xhi));
      if (type == "integer") {
        double a = std::max(std::ceil(lo), std::floor(xlo) + 1);
        double b = std::min(std::floor(hi), std::ceil(xhi) - 1);
        a = std::max(a, -static_cast<double>(kIntegerCap));
        b = std::min(b, static_cast<double>(kIntegerCap));
        if (a > b) return Refuse(path, "no integer lies within the bounds");
        return NewRule(Hint(path), IntegerRange(static_cast<int64_t>(a), static_cast<int64_t>(b)));
      }
      // Numbers: whole bounds from 0 up, inclusive.
      if (s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum")) {
        return Refuse(
            path + (s.contains("exclusiveMinimum") ? "/exclusiveMinimum" : "/exclusiveMaximum"),
            "exclusive bounds on numbers are not supported (integers take them)");
      }
      const double a = s.contains("minimum") ? lo : 0;
      if (a < 0 || std::floor(a) != a || a > kIntegerCap) {
        return Refuse(path + "/minimum", "numbers take whole minimums from 0 up only");
      }
      if (!s.contains("minimum"))
        return Refuse(path + "/maximum", "numbers need a minimum of 0 or more beside a maximum");
      std::string frac = "(\".\" [0-9]{1,15})?";
      if (!s.contains("maximum")) {
        return NewRule(Hint(path),
                       NonNegativeRange(static_cast<int64_t>(a), kIntegerCap) + " " + frac);
      }
      if (std::floor(hi) != hi || hi < a || hi > kIntegerCap) {
        return Refuse(path + "/maximum",
                      "numbers take whole maximums at or above the minimum only");
      }
      const auto ia = static_cast<int64_t>(a), ib = static_cast<int64_t>(hi);
      std::string body = NonNegativeRange(ib, ib) + " (\".\" \"0\"{1,15})?";
      if (ib > ia) body = NonNegativeRange(ia, ib - 1) + " " + frac + " | " + body;
      return NewRule(Hint(path), body);
    }
    if (type == "boolean" || type == "null") return Use(type);
    if (type == "object") return Object(s, path, depth);
    if (type == "array") return Array(s, path, depth);
    return Refuse(path + "/type", "unknown type \"" + type + "\"");
  }

  Expected<std::string> Object(const Json& s, const std::string& path, int depth) {
    std::vector<std::string> names;
    std::vector<std::string> values;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) return Refuse(path + "/properties", "expected an object");
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
        GZ_ASSIGN_OR_RETURN(
            std::string v,
            Visit(it.value(), path + "/properties/" + PointerEscape(it.key()), depth + 1));
        names.push_back(it.key());
        values.push_back(v);
      }
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return Refuse(path + "/required", "expected an array");
      for (const Json& r : s["required"]) {
        if (!r.is_string()) return Refuse(path + "/required", "expected property names");
        if (std::find(names.begin(), names.end(), r.get<std::string>()) == names.end()) {
          // A required property the schema does not describe: any value.
          names.push_back(r.get<std::string>());
          values.push_back(Use("value"));
        }
        required.insert(r.get<std::string>());
      }
    }
    Use("sp");
    if (names.empty()) {
      // No properties: additionalProperties says what the values are (absent or true: any).
      if (s.contains("additionalProperties") && s["additionalProperties"] == false)
        return std::string("\"{}\"");
      std::string value = Use("value");
      if (s.contains("additionalProperties") && s["additionalProperties"] != true) {
        GZ_ASSIGN_OR_RETURN(
            value, Visit(s["additionalProperties"], path + "/additionalProperties", depth + 1));
      }
      Use("string");
      const std::string pair = "string \":\" sp " + value;
      return NewRule(Hint(path), "\"{\" (" + pair + " (\",\" sp " + pair + ")*)? \"}\"");
    }
    if (s.contains("additionalProperties") && !s["additionalProperties"].is_boolean()) {
      // Described properties beside others of a schema: only the described ones are written
      // (other keys would need to differ from every described one).
      GZ_RETURN_IF_ERROR(
          Visit(s["additionalProperties"], path + "/additionalProperties", depth + 1).status());
    }
    // tail(i, first): the properties from i on; `first`: none written yet (no comma before).
    const std::string base = NewRule(Hint(path), "");
    std::vector<std::string> tails(2 * names.size() + 2);
    auto pair_of = [&](size_t i) {
      return GbnfLiteral(Json(names[i]).dump()) + " \":\" sp " + values[i];
    };
    std::string after_first = "\"\"", after_rest = "\"\"";
    for (size_t k = names.size(); k-- > 0;) {
      const bool req = required.count(names[k]) > 0;
      std::string rest_first, rest_next;  // properties from k on, with none or some before
      const std::string with_first = pair_of(k) + " " + after_rest;
      const std::string with_next = "\",\" sp " + pair_of(k) + " " + after_rest;
      rest_first = req ? with_first : "(" + with_first + " | " + after_first + ")";
      rest_next = req ? with_next : "(" + with_next + " | " + after_rest + ")";
      // Name the tails so their text stays linear in the properties.
      after_first = NewRule(base + "-f", rest_first);
      after_rest = NewRule(base + "-n", rest_next);
    }
    rules_[base] = "\"{\" " + after_first + " \"}\"";
    return base;
  }

  Expected<std::string> Array(const Json& s, const std::string& path, int depth) {
    double lo = 0, hi = -1;
    if (s.contains("minItems")) {
      if (!s["minItems"].is_number_integer() || s["minItems"].get<int64_t>() < 0) {
        return Refuse(path + "/minItems", "expected a non-negative integer");
      }
      lo = s["minItems"].get<double>();
    }
    if (s.contains("maxItems")) {
      if (!s["maxItems"].is_number_integer() || s["maxItems"].get<int64_t>() < lo) {
        return Refuse(path + "/maxItems", "expected an integer at least minItems");
      }
      hi = s["maxItems"].get<double>();
    }
    if (lo > 4096 || hi > 4096) return Refuse(path, "minItems/maxItems above 4096");
    Use("sp");
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) return Refuse(path + "/prefixItems", "expected an array");
      for (size_t i = 0; i < s["prefixItems"].size(); ++i) {
        GZ_ASSIGN_OR_RETURN(
            std::string v,
            Visit(s["prefixItems"][i], path + "/prefixItems/" + std::to_string(i), depth + 1));
        prefix.push_back(v);
      }
    }
    const auto p = static_cast<int64_t>(prefix.size());
    std::string item;
    bool more = true;  // items after the prefix
    if (s.contains("items")) {
      if (s["items"] == false) {
        more = false;
      } else {
        GZ_ASSIGN_OR_RETURN(item, Visit(s["items"], path + "/items", depth + 1));
      }
    } else if (p > 0) {
      // After prefixItems anything may follow; only as many as minItems needs are written.
      item = Use("value");
      hi = hi < 0 ? std::max<double>(lo, static_cast<double>(p))
                  : std::min<double>(hi, std::max<double>(lo, p));
    } else {
      item = Use("value");
    }
    const auto min = static_cast<int64_t>(lo);
    const int64_t max = hi < 0 ? -1 : static_cast<int64_t>(hi);
    if (!more && min > p)
      return Refuse(path + "/minItems", "more items than prefixItems with items false");
    // The prefix: its first `min` items required, the rest optional in order.
    const int64_t cap = max < 0 ? p : std::min(p, max);
    std::string body = "\"[\"";
    // Written from the end: rest(i) is what may follow the i-th prefix item.
    std::string extra;  // items after the prefix, each preceded by a comma
    if (more && (max < 0 || max > p)) {
      const int64_t need = std::max<int64_t>(0, min - p);
      const std::string rep =
          max < 0 ? "{" + Digits(need) + ",}" : "{" + Digits(need) + "," + Digits(max - p) + "}";
      extra = "(\",\" sp " + item + ")" + rep;
    }
    if (p == 0) {
      if (!more || max == 0) return std::string("\"[]\"");
      // First item, then the others with commas.
      const int64_t need = std::max<int64_t>(0, min - 1);
      const std::string rep =
          max < 0 ? "{" + Digits(need) + ",}" : "{" + Digits(need) + "," + Digits(max - 1) + "}";
      std::string list = item + " (\",\" sp " + item + ")" + rep;
      if (min == 0) list = "(" + list + ")?";
      return NewRule(Hint(path), "\"[\" " + list + " \"]\"");
    }
    std::string tail = extra.empty() ? "\"\"" : extra;
    for (int64_t i = cap; i-- > 0;) {
      const std::string sep = i == 0 ? "" : "\",\" sp ";
      std::string here = sep + prefix[i] + " " + tail;
      tail = i < min ? here : "(" + here + " | \"\")";
      tail = NewRule(Hint(path) + "-p", tail);
    }
    return NewRule(Hint(path), body + " " + tail + " \"]\"");
  }

  const Json& root_;
  std::map<std::string, std::string> rules_;
  std::vector<std::string> order_;
  std::map<std::string, std::string> refs_;
  int kinds_depth_ = 0;
};

}  // namespace

Expected<std::string> JsonSchemaToGbnf(std::string_view schema) {
  Json root = Json::parse(schema, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return InvalidArgument("json schema: not valid JSON");
  try {
    return SchemaCompiler(root).Run();
  } catch (const nlohmann::json::exception& e) {
    // A keyword of an unexpected JSON type that a check above missed.
    return InvalidArgument(std::string("json schema: ") + e.what());
  }
}

Expected<Grammar> JsonSchemaGrammar(std::string_view schema) {
  GZ_ASSIGN_OR_RETURN(std::string gbnf, JsonSchemaToGbnf(schema));
  return ParseGbnf(gbnf, "json schema grammar");
}

std::string JsonObjectGbnf() {
  std::string out = "root ::= object\n";
  for (const char* name :
       {"sp", "hex", "char", "string", "number", "boolean", "null", "value", "object", "array"}) {
    out += std::string(name) + " ::= " + Primitives().at(name) + "\n";
  }
  return out;
}

}  // namespace gizllm
