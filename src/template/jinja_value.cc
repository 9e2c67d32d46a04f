#include "template/jinja_value.h"

#include <utf8proc.h>

#include <charconv>
#include <cmath>
#include <cstdio>

namespace gizllm::jinja {

Value Value::MakeList(List items) { return Value(std::make_shared<List>(std::move(items))); }
Value Value::MakeTuple(List items) {
  Value v = MakeList(std::move(items));
  v.tuple_ = true;
  return v;
}

Value Value::MakeGenerator(List items) {
  Value v = MakeList(std::move(items));
  v.generator_ = true;
  return v;
}

Value Value::MakeDict() { return Value(std::make_shared<Dict>()); }

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value(None{});
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      // Python's ints are unbounded; past int64 the nearest double is the closest this gets.
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJson(e));
      return MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = MakeDict();
      for (const auto& [k, v] : j.items()) d.AsDict().items.emplace_back(k, FromJson(v));
      return d;
    }
    default:
      return Value(None{});
  }
}

bool Value::Truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return AsBool();
    case Kind::kInt:
      return AsInt() != 0;
    case Kind::kFloat:
      return AsDouble() != 0.0;
    case Kind::kString:
      return !AsString().empty();
    case Kind::kList:
      return generator_ || !AsList().empty();
    case Kind::kDict:
      return AsDict().is_namespace || !AsDict().items.empty();
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string Value::TypeName() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return generator_ ? "generator" : tuple_ ? "tuple" : "list";
    case Kind::kDict:
      return AsDict().is_namespace ? "Namespace" : "dict";
    case Kind::kCallable:
      return "function";
  }
  return "?";
}

namespace {

// Python's str.isprintable for one code point.
bool IsPrintable(char32_t cp) {
  if (cp == ' ') return true;
  if (cp < 0x20 || cp == 0x7f) return false;
  if (cp < 0x7f) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

std::string ReprString(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t cp : DecodeUtf8(s)) {
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (!IsPrintable(cp)) {
      char buf[16];
      if (cp < 0x100) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(cp));
      } else if (cp < 0x10000) {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      } else {
        std::snprintf(buf, sizeof(buf), "\\U%08x", static_cast<unsigned>(cp));
      }
      out += buf;
    } else {
      AppendUtf8(cp, out);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string FormatFloat(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci: [-]d[.ddd]e(+|-)XX
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  int exponent = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out += digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += ebuf;
  }
  return out;
}

std::string Value::Str() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return AsString();
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  std::string out;
  ReprTo(out, 0);
  return out;
}

void Value::ReprTo(std::string& out, int depth) const {
  // A list that holds itself (through a namespace, say) prints as Python prints it, "[...]";
  // nesting past kMaxValueNesting or text past kMaxReprBytes is cut the same way, so no value
  // exhausts the stack or the memory.
  const bool container = kind() == Kind::kList || kind() == Kind::kDict;
  if (container && (depth > kMaxValueNesting || out.size() > kMaxReprBytes)) {
    out += kind() == Kind::kList ? "[...]" : "{...}";
    return;
  }
  switch (kind()) {
    case Kind::kUndefined:
      return;
    case Kind::kNone:
      out += "None";
      return;
    case Kind::kBool:
      out += AsBool() ? "True" : "False";
      return;
    case Kind::kInt:
      out += std::to_string(AsInt());
      return;
    case Kind::kFloat:
      out += FormatFloat(AsDouble());
      return;
    case Kind::kString:
      out += ReprString(AsString());
      return;
    case Kind::kList: {
      if (generator_) {
        out += "<generator object>";
        return;
      }
      out += tuple_ ? "(" : "[";
      bool first = true;
      for (const Value& v : AsList()) {
        if (!first) out += ", ";
        first = false;
        v.ReprTo(out, depth + 1);
      }
      if (tuple_) {
        out += AsList().size() == 1 ? ",)" : ")";
      } else {
        out += "]";
      }
      return;
    }
    case Kind::kDict: {
      out += AsDict().is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : AsDict().items) {
        if (!first) out += ", ";
        first = false;
        out += ReprString(k) + ": ";
        v.ReprTo(out, depth + 1);
      }
      out += AsDict().is_namespace ? "}>" : "}";
      return;
    }
    case Kind::kCallable:
      out += "<function " + AsCallable().name + ">";
      return;
  }
}

const Value* Dict::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::Set(const std::string& key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

const Value* Args::Get(size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

namespace {

bool EqualsAt(const Value& a, const Value& b, int depth) {
  using K = Value::Kind;
  if (a.IsNumber() && b.IsNumber()) {
    if (a.IsFloat() || b.IsFloat()) return a.AsDouble() == b.AsDouble();
    return a.AsInt() == b.AsInt();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.AsString() == b.AsString();
    case K::kList: {
      // The same list is equal to itself (as Python's containers compare identity first);
      // past kMaxValueNesting only the same list is.
      if (a.list_ptr() == b.list_ptr()) return a.IsTuple() == b.IsTuple();
      if (a.IsGenerator() || b.IsGenerator() || depth > kMaxValueNesting) return false;
      if (a.IsTuple() != b.IsTuple()) return false;
      const List& x = a.AsList();
      const List& y = b.AsList();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!EqualsAt(x[i], y[i], depth + 1)) return false;
      }
      return true;
    }
    case K::kDict: {
      const Dict& x = a.AsDict();
      const Dict& y = b.AsDict();
      if (x.is_namespace || y.is_namespace || &x == &y) return &x == &y;
      if (x.items.size() != y.items.size() || depth > kMaxValueNesting) return false;
      for (const auto& [k, v] : x.items) {
        const Value* w = y.Find(k);
        if (w == nullptr || !EqualsAt(v, *w, depth + 1)) return false;
      }
      return true;
    }
    case K::kCallable:
      return &a.AsCallable() == &b.AsCallable();
    default:
      return false;
  }
}

}  // namespace

bool Equals(const Value& a, const Value& b) { return EqualsAt(a, b, 0); }

namespace {

void JsonString(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  if (ensure_ascii) {
    for (char32_t cp : DecodeUtf8(s)) {
      if (cp < 0x80) {
        std::string one(1, static_cast<char>(cp));
        std::string quoted;
        JsonString(one, false, quoted);
        out += quoted.substr(1, quoted.size() - 2);
        continue;
      }
      auto unit = [&](unsigned u) {
        char buf[16];
        std::snprintf(buf, sizeof(buf), "\\u%04x", u);
        out += buf;
      };
      if (cp >= 0x10000) {
        unsigned v = static_cast<unsigned>(cp) - 0x10000;
        unit(0xD800 + (v >> 10));
        unit(0xDC00 + (v & 0x3FF));
      } else {
        unit(static_cast<unsigned>(cp));
      }
    }
    out += '"';
    return;
  }
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

Status JsonValue(const Value& v, const std::optional<std::string>& indent, bool ascii, int level,
                 std::string& out) {
  using K = Value::Kind;
  auto newline = [&](int l) {
    out += '\n';
    for (int i = 0; i < l; ++i) out += *indent;
  };
  const char* item_sep = indent ? "," : ", ";
  if (level > kMaxValueNesting || out.size() > kMaxReprBytes) {
    return InvalidArgument("tojson: circular reference, nesting deeper than " +
                           std::to_string(kMaxValueNesting) + " or text past " +
                           std::to_string(kMaxReprBytes) + " bytes");
  }
  switch (v.kind()) {
    case K::kNone:
      out += "null";
      return Status::Ok();
    case K::kBool:
      out += v.AsBool() ? "true" : "false";
      return Status::Ok();
    case K::kInt:
      out += std::to_string(v.AsInt());
      return Status::Ok();
    case K::kFloat: {
      double f = v.AsDouble();
      if (std::isnan(f)) {
        out += "NaN";
      } else if (std::isinf(f)) {
        out += f > 0 ? "Infinity" : "-Infinity";
      } else {
        out += FormatFloat(f);
      }
      return Status::Ok();
    }
    case K::kString:
      JsonString(v.AsString(), ascii, out);
      return Status::Ok();
    case K::kList: {
      if (v.IsGenerator())
        return InvalidArgument("Object of type generator is not JSON serializable");
      const List& l = v.AsList();
      if (l.empty()) {
        out += "[]";
        return Status::Ok();
      }
      out += '[';
      for (size_t i = 0; i < l.size(); ++i) {
        if (i > 0) out += item_sep;
        if (indent) newline(level + 1);
        GZ_RETURN_IF_ERROR(JsonValue(l[i], indent, ascii, level + 1, out));
      }
      if (indent) newline(level);
      out += ']';
      return Status::Ok();
    }
    case K::kDict: {
      const Dict& d = v.AsDict();
      if (d.items.empty()) {
        out += "{}";
        return Status::Ok();
      }
      out += '{';
      for (size_t i = 0; i < d.items.size(); ++i) {
        if (i > 0) out += item_sep;
        if (indent) newline(level + 1);
        JsonString(d.items[i].first, ascii, out);
        out += ": ";
        GZ_RETURN_IF_ERROR(JsonValue(d.items[i].second, indent, ascii, level + 1, out));
      }
      if (indent) newline(level);
      out += '}';
      return Status::Ok();
    }
    default:
      return InvalidArgument("Object of type " + v.TypeName() + " is not JSON serializable");
  }
}

}  // namespace

Expected<std::string> ToJson(const Value& value, const std::optional<std::string>& indent,
                             bool ensure_ascii) {
  std::string out;
  GZ_RETURN_IF_ERROR(JsonValue(value, indent, ensure_ascii, 0, out));
  return out;
}

std::vector<char32_t> DecodeUtf8(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t cp;
    auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                              static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) {
      out.push_back(0xFFFD);
      i += 1;
    } else {
      out.push_back(static_cast<char32_t>(cp));
      i += static_cast<size_t>(n);
    }
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string& out) {
  utf8proc_uint8_t buf[4];
  auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string EncodeUtf8(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) AppendUtf8(cp, out);
  return out;
}

size_t Utf8Length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool IsPySpace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f);
  if (cp == 0x85 || cp == 0xa0) return true;
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  if (cat == UTF8PROC_CATEGORY_ZS) return true;
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
  return p->bidi_class == UTF8PROC_BIDI_CLASS_WS || p->bidi_class == UTF8PROC_BIDI_CLASS_B ||
         p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

}  // namespace gizllm::jinja
