// Values of the Jinja interpreter, with Python's semantics: truthiness, equality, str() and
// repr() of lists and dicts, json.dumps as transformers' tojson calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "core/status.h"

namespace gizllm::jinja {

class Value;
struct Dict;

// How deeply values nest before printing, comparing and tojson stop descending: a template
// can build a list that holds itself, or one nested without end.
inline constexpr int kMaxValueNesting = 256;
// The longest text repr() and tojson write before they stop (64 MiB).
inline constexpr size_t kMaxReprBytes = size_t{64} << 20;
struct Callable;
using List = std::vector<Value>;
using ListPtr = std::shared_ptr<List>;
using DictPtr = std::shared_ptr<Dict>;
using CallablePtr = std::shared_ptr<Callable>;

struct Undefined {
  std::string name;  // what was looked up, for error messages
};
struct None {};

// One value. Lists and dicts are shared, as Python objects are: a namespace set inside a loop
// is seen outside it.
class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  Value() : v_(Undefined{}) {}
  static Value MakeUndefined(std::string name) { return Value(Undefined{std::move(name)}); }
  Value(None) : v_(None{}) {}                        // NOLINT
  Value(bool b) : v_(b) {}                           // NOLINT
  Value(int64_t i) : v_(i) {}                        // NOLINT
  Value(int i) : v_(int64_t{i}) {}                   // NOLINT
  Value(double f) : v_(f) {}                         // NOLINT
  Value(std::string s) : v_(std::move(s)) {}         // NOLINT
  Value(const char* s) : v_(std::string(s)) {}       // NOLINT
  Value(std::string_view s) : v_(std::string(s)) {}  // NOLINT
  Value(ListPtr l) : v_(std::move(l)) {}             // NOLINT
  Value(DictPtr d) : v_(std::move(d)) {}             // NOLINT
  Value(CallablePtr c) : v_(std::move(c)) {}         // NOLINT
  static Value MakeList(List items = {});
  // A Python tuple: a list that prints with parentheses.
  static Value MakeTuple(List items);
  // What Jinja's map, select, reject, unique and reverse return: a generator, here with its
  // items already computed. It is always true, has no len(), and cannot be indexed.
  static Value MakeGenerator(List items);
  static Value MakeDict();
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool IsUndefined() const { return kind() == Kind::kUndefined; }
  bool IsNone() const { return kind() == Kind::kNone; }
  bool IsBool() const { return kind() == Kind::kBool; }
  bool IsInt() const { return kind() == Kind::kInt; }
  bool IsFloat() const { return kind() == Kind::kFloat; }
  // Python numbers: bool is an int there.
  bool IsNumber() const { return IsBool() || IsInt() || IsFloat(); }
  bool IsString() const { return kind() == Kind::kString; }
  bool IsList() const { return kind() == Kind::kList; }
  bool IsTuple() const { return tuple_; }
  bool IsGenerator() const { return generator_; }
  bool IsDict() const { return kind() == Kind::kDict; }
  bool IsCallable() const { return kind() == Kind::kCallable; }

  bool AsBool() const { return std::get<bool>(v_); }
  int64_t AsInt() const { return IsBool() ? int64_t{AsBool()} : std::get<int64_t>(v_); }
  double AsDouble() const {
    return IsFloat() ? std::get<double>(v_) : static_cast<double>(AsInt());
  }
  const std::string& AsString() const { return std::get<std::string>(v_); }
  List& AsList() const { return *std::get<ListPtr>(v_); }
  Dict& AsDict() const { return *std::get<DictPtr>(v_); }
  const ListPtr& list_ptr() const { return std::get<ListPtr>(v_); }
  const DictPtr& dict_ptr() const { return std::get<DictPtr>(v_); }
  const Callable& AsCallable() const { return *std::get<CallablePtr>(v_); }
  const std::string& undefined_name() const { return std::get<Undefined>(v_).name; }

  // Python's bool(value).
  bool Truthy() const;
  // Python's str(value); Jinja prints undefined as "".
  std::string Str() const;
  // Python's repr(value).
  std::string Repr() const;
  // The Python type name, for error messages.
  std::string TypeName() const;

 private:
  explicit Value(Undefined u) : v_(std::move(u)) {}
  void ReprTo(std::string& out, int depth) const;
  std::variant<Undefined, None, bool, int64_t, double, std::string, ListPtr, DictPtr, CallablePtr>
      v_;
  bool tuple_ = false;
  bool generator_ = false;
};

// A Python dict with string keys, in insertion order. A namespace() is a dict whose attributes
// may be assigned.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;

  const Value* Find(std::string_view key) const;
  void Set(const std::string& key, Value value);
};

// Arguments of a call: positional, then keyword.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index` or named `name`, or nullptr.
  const Value* Get(size_t index, std::string_view name) const;
};

struct Callable {
  std::string name;
  std::function<Expected<Value>(const Args&)> call;
};

// Python's ==.
bool Equals(const Value& a, const Value& b);

// json.dumps(value, ensure_ascii=ensure_ascii, indent=indent) with Python's default separators:
// ", " and ": ", or "," and ": " with an indent. `indent` is the text of one level (nullopt: none).
Expected<std::string> ToJson(const Value& value, const std::optional<std::string>& indent,
                             bool ensure_ascii = false);

// Python's repr(float).
std::string FormatFloat(double f);

// Text as Unicode code points and back (invalid bytes read as U+FFFD).
std::vector<char32_t> DecodeUtf8(std::string_view s);
std::string EncodeUtf8(const std::vector<char32_t>& cps);
void AppendUtf8(char32_t cp, std::string& out);
// Number of code points (Python's len of a str).
size_t Utf8Length(std::string_view s);
// Python's str.isspace for one code point.
bool IsPySpace(char32_t cp);

}  // namespace gizllm::jinja
