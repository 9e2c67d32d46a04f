#include "template/jinja_builtins.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <ctime>

namespace gizllm::jinja {

namespace {

using Cps = std::vector<char32_t>;

Status TypeError(const std::string& m) { return InvalidArgument(m); }

bool IsAscii(std::string_view s) {
  for (unsigned char c : s) {
    if (c >= 0x80) return false;
  }
  return true;
}

char32_t ToUpper(char32_t c) {
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t ToLower(char32_t c) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
char32_t ToTitle(char32_t c) {
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}
bool IsCased(char32_t c) {
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

// Python's full case mappings where they differ from the one-character ones (SpecialCasing):
// the sharp s and the Latin ligatures.
struct SpecialCase {
  char32_t c;
  const char* upper;
  const char* title;
};
constexpr SpecialCase kSpecialCases[] = {
    {0xDF, "SS", "Ss"},     {0xFB00, "FF", "Ff"},   {0xFB01, "FI", "Fi"}, {0xFB02, "FL", "Fl"},
    {0xFB03, "FFI", "Ffi"}, {0xFB04, "FFL", "Ffl"}, {0xFB05, "ST", "St"}, {0xFB06, "ST", "St"}};

void AppendCased(char32_t c, bool title, std::string& out) {
  for (const SpecialCase& s : kSpecialCases) {
    if (s.c == c) {
      out += title ? s.title : s.upper;
      return;
    }
  }
  AppendUtf8(title ? ToTitle(c) : ToUpper(c), out);
}

std::string Upper(const std::string& s) {
  std::string out;
  for (char32_t c : DecodeUtf8(s)) AppendCased(c, /*title=*/false, out);
  return out;
}
std::string Lower(const std::string& s) {
  Cps c = DecodeUtf8(s);
  for (auto& x : c) x = ToLower(x);
  return EncodeUtf8(c);
}
// Python's str.title.
std::string PyTitle(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    bool cased = IsCased(c);
    if (cased && prev_cased) {
      AppendUtf8(ToLower(c), out);
    } else if (cased) {
      AppendCased(c, /*title=*/true, out);
    } else {
      AppendUtf8(c, out);
    }
    prev_cased = cased;
  }
  return out;
}
// Python's str.capitalize.
std::string Capitalize(const std::string& s) {
  std::string out;
  Cps c = DecodeUtf8(s);
  for (size_t i = 0; i < c.size(); ++i) {
    if (i == 0) {
      AppendCased(c[i], /*title=*/true, out);
    } else {
      AppendUtf8(ToLower(c[i]), out);
    }
  }
  return out;
}
// Jinja's title filter: each word split at whitespace, -, (, {, [, < starts upper.
std::string JinjaTitle(const std::string& s) {
  Cps c = DecodeUtf8(s);
  bool word_start = true;
  for (auto& x : c) {
    bool sep = IsPySpace(x) || x == '-' || x == '(' || x == '{' || x == '[' || x == '<';
    if (sep) {
      word_start = true;
      continue;
    }
    x = word_start ? ToUpper(x) : ToLower(x);
    word_start = false;
  }
  return EncodeUtf8(c);
}

// Python's str.strip / lstrip / rstrip; chars == nullptr strips whitespace.
std::string Strip(const std::string& s, const std::string* chars, bool left, bool right) {
  Cps c = DecodeUtf8(s);
  Cps set = chars ? DecodeUtf8(*chars) : Cps{};
  auto strip = [&](char32_t x) {
    return chars ? std::find(set.begin(), set.end(), x) != set.end() : IsPySpace(x);
  };
  size_t b = 0, e = c.size();
  if (left) {
    while (b < e && strip(c[b])) ++b;
  }
  if (right) {
    while (e > b && strip(c[e - 1])) --e;
  }
  return EncodeUtf8(Cps(c.begin() + static_cast<long>(b), c.begin() + static_cast<long>(e)));
}

std::vector<std::string> SplitWhitespace(const std::string& s, int64_t maxsplit) {
  std::vector<std::string> out;
  Cps c = DecodeUtf8(s);
  size_t i = 0;
  while (i < c.size()) {
    while (i < c.size() && IsPySpace(c[i])) ++i;
    if (i >= c.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      size_t e = c.size();
      while (e > i && IsPySpace(c[e - 1])) --e;
      out.push_back(
          EncodeUtf8(Cps(c.begin() + static_cast<long>(i), c.begin() + static_cast<long>(e))));
      break;
    }
    size_t j = i;
    while (j < c.size() && !IsPySpace(c[j])) ++j;
    out.push_back(
        EncodeUtf8(Cps(c.begin() + static_cast<long>(i), c.begin() + static_cast<long>(j))));
    i = j;
  }
  return out;
}

std::vector<std::string> Split(const std::string& s, const std::string& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  size_t start = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    size_t at = s.find(sep, start);
    if (at == std::string::npos) break;
    out.push_back(s.substr(start, at - start));
    start = at + sep.size();
  }
  out.push_back(s.substr(start));
  return out;
}

std::string Replace(const std::string& s, const std::string& old, const std::string& repl,
                    int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `repl` between characters and at both ends.
    Cps c = DecodeUtf8(s);
    int64_t done = 0;
    for (size_t i = 0; i <= c.size(); ++i) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (i < c.size()) AppendUtf8(c[i], out);
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out += s.substr(start, at - start) + repl;
    start = at + old.size();
    ++done;
  }
  return out + s.substr(start);
}

Value StringList(const std::vector<std::string>& parts) {
  List l;
  for (const auto& p : parts) l.push_back(Value(p));
  return Value::MakeList(std::move(l));
}

Expected<int64_t> IntArg(const Value* v, int64_t fallback, const char* what) {
  if (v == nullptr || v->IsNone()) return fallback;
  if (v->IsInt() || v->IsBool()) return v->AsInt();
  return TypeError(std::string(what) + " must be an integer, not '" + v->TypeName() + "'");
}

Expected<std::string> StrArg(const Value* v, const char* what) {
  if (v == nullptr || !v->IsString()) {
    return TypeError(std::string(what) + " must be a string");
  }
  return v->AsString();
}

// Python's str.format with {} {0} {name} fields and no format specs.
Expected<Value> Format(const std::string& fmt, const Args& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      size_t close = fmt.find('}', i);
      if (close == std::string::npos) return TypeError("format: single '{' in format string");
      std::string field = fmt.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!.[") != std::string::npos) {
        return Unimplemented("format: field '" + field + "' is not supported");
      }
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_index < args.positional.size() ? &args.positional[auto_index] : nullptr;
        ++auto_index;
      } else if (field[0] >= '0' && field[0] <= '9') {
        size_t idx = 0;
        auto r = std::from_chars(field.data(), field.data() + field.size(), idx);
        v = r.ec == std::errc() && idx < args.positional.size() ? &args.positional[idx] : nullptr;
      } else {
        for (const auto& [k, kv] : args.keyword) {
          if (k == field) v = &kv;
        }
      }
      if (v == nullptr) return TypeError("format: no argument for field '{" + field + "}'");
      out += v->Str();
      i = close;
    } else if (c == '}') {
      return TypeError("format: single '}' in format string");
    } else {
      out += c;
    }
  }
  return Value(std::move(out));
}

Value Method(std::string name, std::function<Expected<Value>(const Args&)> f) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->call = std::move(f);
  return Value(std::move(c));
}

std::optional<Value> StringMethod(const std::string& s, const std::string& name) {
  if (name == "startswith" || name == "endswith") {
    bool start = name == "startswith";
    return Method(name, [s, start](const Args& a) -> Expected<Value> {
      const Value* p = a.Get(0, "prefix");
      if (p == nullptr) return TypeError("startswith/endswith take a prefix");
      auto test = [&](const std::string& x) {
        if (x.size() > s.size()) return false;
        return start ? s.compare(0, x.size(), x) == 0
                     : s.compare(s.size() - x.size(), x.size(), x) == 0;
      };
      if (p->IsString()) return Value(test(p->AsString()));
      if (p->IsList()) {
        for (const Value& x : p->AsList()) {
          if (x.IsString() && test(x.AsString())) return Value(true);
        }
        return Value(false);
      }
      return TypeError("startswith/endswith first arg must be str or a tuple of str");
    });
  }
  if (name == "split" || name == "rsplit") {
    bool right = name == "rsplit";
    return Method(name, [s, right](const Args& a) -> Expected<Value> {
      const Value* sep = a.Get(0, "sep");
      GZ_ASSIGN_OR_RETURN(int64_t maxsplit, IntArg(a.Get(1, "maxsplit"), -1, "maxsplit"));
      if (right && maxsplit >= 0) return Unimplemented("rsplit with maxsplit is not supported");
      if (sep == nullptr || sep->IsNone()) return StringList(SplitWhitespace(s, maxsplit));
      if (!sep->IsString()) return TypeError("must be str or None, not " + sep->TypeName());
      if (sep->AsString().empty()) return TypeError("empty separator");
      return StringList(Split(s, sep->AsString(), maxsplit));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool left = name != "rstrip", right = name != "lstrip";
    return Method(name, [s, left, right](const Args& a) -> Expected<Value> {
      const Value* chars = a.Get(0, "chars");
      if (chars != nullptr && !chars->IsNone() && !chars->IsString()) {
        return TypeError("strip arg must be None or str");
      }
      const std::string* cs = chars != nullptr && chars->IsString() ? &chars->AsString() : nullptr;
      return Value(Strip(s, cs, left, right));
    });
  }
  if (name == "replace") {
    return Method(name, [s](const Args& a) -> Expected<Value> {
      GZ_ASSIGN_OR_RETURN(std::string old, StrArg(a.Get(0, "old"), "replace() argument 1"));
      GZ_ASSIGN_OR_RETURN(std::string repl, StrArg(a.Get(1, "new"), "replace() argument 2"));
      GZ_ASSIGN_OR_RETURN(int64_t count, IntArg(a.Get(2, "count"), -1, "count"));
      return Value(Replace(s, old, repl, count));
    });
  }
  if (name == "upper")
    return Method(name, [s](const Args&) -> Expected<Value> { return Value(Upper(s)); });
  if (name == "lower")
    return Method(name, [s](const Args&) -> Expected<Value> { return Value(Lower(s)); });
  if (name == "title")
    return Method(name, [s](const Args&) -> Expected<Value> { return Value(PyTitle(s)); });
  if (name == "capitalize") {
    return Method(name, [s](const Args&) -> Expected<Value> { return Value(Capitalize(s)); });
  }
  if (name == "format") {
    return Method(name, [s](const Args& a) -> Expected<Value> { return Format(s, a); });
  }
  if (name == "join") {
    return Method(name, [s](const Args& a) -> Expected<Value> {
      const Value* items = a.Get(0, "iterable");
      if (items == nullptr) return TypeError("join() takes exactly one argument");
      GZ_ASSIGN_OR_RETURN(List l, Iterate(*items));
      std::string out;
      for (size_t i = 0; i < l.size(); ++i) {
        if (!l[i].IsString()) {
          return TypeError("sequence item " + std::to_string(i) + ": expected str instance, " +
                           l[i].TypeName() + " found");
        }
        if (i > 0) out += s;
        out += l[i].AsString();
      }
      return Value(std::move(out));
    });
  }
  if (name == "find" || name == "count") {
    bool find = name == "find";
    return Method(name, [s, find](const Args& a) -> Expected<Value> {
      GZ_ASSIGN_OR_RETURN(std::string sub, StrArg(a.Get(0, "sub"), "argument"));
      if (find) {
        size_t at = s.find(sub);
        if (at == std::string::npos) return Value(int64_t{-1});
        return Value(static_cast<int64_t>(Utf8Length(std::string_view(s).substr(0, at))));
      }
      if (sub.empty()) return Value(static_cast<int64_t>(Utf8Length(s) + 1));
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) {
        ++n;
      }
      return Value(n);
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isupper" ||
      name == "islower" || name == "isalnum") {
    return Method(name, [s, name](const Args&) -> Expected<Value> {
      Cps c = DecodeUtf8(s);
      if (c.empty()) return Value(false);
      bool any_cased = false;
      for (char32_t x : c) {
        auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(x));
        bool letter = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
        bool digit = cat == UTF8PROC_CATEGORY_ND;
        if (name == "isdigit" && !digit) return Value(false);
        if (name == "isalpha" && !letter) return Value(false);
        if (name == "isalnum" && !letter && !digit) return Value(false);
        if (name == "isspace" && !IsPySpace(x)) return Value(false);
        if (name == "isupper" && (cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT)) {
          return Value(false);
        }
        if (name == "islower" && (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT)) {
          return Value(false);
        }
        any_cased = any_cased || IsCased(x);
      }
      if (name == "isupper" || name == "islower") return Value(any_cased);
      return Value(true);
    });
  }
  return std::nullopt;
}

std::optional<Value> DictMethod(const Value& self, const std::string& name) {
  DictPtr d = self.dict_ptr();
  if (name == "items" || name == "keys" || name == "values") {
    return Method(name, [d, name](const Args&) -> Expected<Value> {
      List l;
      for (const auto& [k, v] : d->items) {
        if (name == "items") {
          l.push_back(Value::MakeTuple({Value(k), v}));
        } else {
          l.push_back(name == "keys" ? Value(k) : v);
        }
      }
      return Value::MakeList(std::move(l));
    });
  }
  if (name == "get") {
    return Method(name, [d](const Args& a) -> Expected<Value> {
      const Value* key = a.Get(0, "key");
      if (key == nullptr) return TypeError("get expected at least 1 argument");
      const Value* fallback = a.Get(1, "default");
      if (key->IsString()) {
        if (const Value* v = d->Find(key->AsString())) return *v;
      }
      return fallback != nullptr ? *fallback : Value(None{});
    });
  }
  return std::nullopt;
}

Expected<Value> Length(const Value& v) {
  if (v.IsUndefined()) return Value(int64_t{0});
  if (v.IsString()) return Value(static_cast<int64_t>(Utf8Length(v.AsString())));
  if (v.IsList() && !v.IsGenerator()) return Value(static_cast<int64_t>(v.AsList().size()));
  if (v.IsDict() && !v.AsDict().is_namespace) {
    return Value(static_cast<int64_t>(v.AsDict().items.size()));
  }
  return TypeError("object of type '" + v.TypeName() + "' has no len()");
}

// Python's a < b; sets `*error` for types Python cannot order (and for lists nested past
// kMaxValueNesting).
bool Less(const Value& a, const Value& b, Status* error, int depth = 0) {
  if (a.IsNumber() && b.IsNumber()) {
    if (a.IsFloat() || b.IsFloat()) return a.AsDouble() < b.AsDouble();
    return a.AsInt() < b.AsInt();
  }
  if (a.IsString() && b.IsString()) return a.AsString() < b.AsString();
  if (a.IsList() && b.IsList() && !a.IsGenerator() && !b.IsGenerator() &&
      a.IsTuple() == b.IsTuple()) {
    const List& x = a.AsList();
    const List& y = b.AsList();
    if (depth > kMaxValueNesting) {
      if (error->ok()) *error = InvalidArgument("'<' between lists nested too deeply");
      return false;
    }
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equals(x[i], y[i])) return Less(x[i], y[i], error, depth + 1);
    }
    return x.size() < y.size();
  }
  if (error->ok()) {
    *error = TypeError("'<' not supported between instances of '" + a.TypeName() + "' and '" +
                       b.TypeName() + "'");
  }
  return false;
}

// Jinja's attribute getter for filters: "a.b.0" walks items and attributes.
Expected<Value> GetPath(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    int64_t index = 0;
    auto r = std::from_chars(part.data(), part.data() + part.size(), index);
    if (!part.empty() && r.ec == std::errc() && r.ptr == part.data() + part.size()) {
      GZ_ASSIGN_OR_RETURN(cur, GetItem(cur, Value(index)));
    } else {
      GZ_ASSIGN_OR_RETURN(cur, GetItem(cur, Value(part)));
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

// Python's printf-style `fmt % args`: %s %r %d %i %f %e %g %x %o %c %%, with flags (- 0 + space),
// width, precision and %(name)s keys of a dict.
Expected<Value> PercentFormat(const std::string& fmt, const Value& args) {
  std::vector<Value> items;
  if (args.IsTuple()) {
    items = args.AsList();
  } else {
    items.push_back(args);
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) return TypeError("incomplete format");
    if (fmt[i] == '%') {
      out += '%';
      continue;
    }
    const Value* value = nullptr;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos || !args.IsDict())
        return TypeError("format requires a mapping");
      value = args.AsDict().Find(fmt.substr(i + 1, close - i - 1));
      if (value == nullptr)
        return TypeError("format key '" + fmt.substr(i + 1, close - i - 1) + "' missing");
      i = close + 1;
    }
    std::string spec = "%";
    while (i < fmt.size() && std::string_view("-+ 0#").find(fmt[i]) != std::string_view::npos)
      spec += fmt[i++];
    size_t digits = 0;  // of the width or the precision being read
    while (i < fmt.size() && (std::isdigit(static_cast<unsigned char>(fmt[i])) || fmt[i] == '.')) {
      digits = fmt[i] == '.' ? 0 : digits + 1;
      // Wider formats would only make a template's output huge.
      if (digits > 3) return InvalidArgument("format width or precision above 999");
      spec += fmt[i++];
    }
    if (i >= fmt.size()) return TypeError("incomplete format");
    char type = fmt[i];
    if (value == nullptr) {
      if (next >= items.size()) return TypeError("not enough arguments for format string");
      value = &items[next++];
    }
    char buf[2048];  // the longest: "%.999f" of 1e308, 1,309 characters
    switch (type) {
      case 's':
      case 'r': {
        std::string text = type == 's' ? value->Str() : value->Repr();
        // Width and precision apply to characters; apply them by hand on the UTF-8 text.
        std::string flags = spec.substr(1);
        bool left = flags.find('-') != std::string::npos;
        size_t dot = flags.find('.');
        std::string width_text = flags.substr(0, dot);
        width_text.erase(0, width_text.find_first_not_of("-+ 0#"));
        size_t width = width_text.empty() ? 0 : std::stoul(width_text);
        if (dot != std::string::npos) {
          size_t precision = std::stoul("0" + flags.substr(dot + 1));
          std::vector<char32_t> c = DecodeUtf8(text);
          if (c.size() > precision) c.resize(precision);
          text = EncodeUtf8(c);
        }
        size_t length = Utf8Length(text);
        std::string pad = length < width ? std::string(width - length, ' ') : "";
        out += left ? text + pad : pad + text;
        continue;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o':
      case 'c': {
        if (!value->IsNumber())
          return TypeError("%" + std::string(1, type) + " format: a number is required, not " +
                           value->TypeName());
        long long n = value->IsFloat() ? static_cast<long long>(value->AsDouble()) : value->AsInt();
        if (type == 'c') {
          AppendUtf8(static_cast<char32_t>(n), out);
          continue;
        }
        std::snprintf(buf, sizeof(buf), (spec + "ll" + (type == 'i' ? 'd' : type)).c_str(), n);
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
        if (!value->IsNumber()) return TypeError("must be real number, not " + value->TypeName());
        std::snprintf(buf, sizeof(buf), (spec + type).c_str(), value->AsDouble());
        break;
      default:
        return Unimplemented(std::string("unsupported format character '") + type + "'");
    }
    out += buf;
  }
  // Python's quirk: a list or dict on the right is one argument that may go unused.
  bool may_go_unused = args.IsDict() || (args.IsList() && !args.IsTuple());
  if (!may_go_unused && next < items.size()) {
    return TypeError("not all arguments converted during string formatting");
  }
  return Value(std::move(out));
}

bool ArgTruthy(const Value* v, bool fallback) { return v == nullptr ? fallback : v->Truthy(); }

Expected<Value> IndentFilter(const std::string& s, const Args& a) {
  const Value* width = a.Get(0, "width");
  std::string indention = "    ";
  if (width != nullptr) {
    if (width->IsString()) {
      indention = width->AsString();
    } else {
      GZ_ASSIGN_OR_RETURN(int64_t w, IntArg(width, 4, "width"));
      if (w > 4096) return InvalidArgument("indent width above 4096");
      indention = std::string(static_cast<size_t>(std::max<int64_t>(w, 0)), ' ');
    }
  }
  bool first = ArgTruthy(a.Get(1, "first"), false);
  bool blank = ArgTruthy(a.Get(2, "blank"), false);
  // Python's splitlines over s + "\n".
  std::vector<std::string> lines;
  std::string text = s + "\n";
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n' || text[i] == '\r') {
      lines.push_back(text.substr(start, i - start));
      if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i > 0 ? "\n" + indention : "") + lines[i];
  } else {
    rv = lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n" + (lines[i].empty() ? "" : indention + lines[i]);
    }
  }
  if (first) rv = indention + rv;
  return Value(std::move(rv));
}

Expected<bool> TestMatches(const Value& item, const Args& a, size_t test_index,
                           bool default_truthy) {
  const Value* test = a.Get(test_index, "");
  if (test == nullptr) return item.Truthy();
  if (!test->IsString()) return TypeError("the test name must be a string");
  Args rest;
  for (size_t i = test_index + 1; i < a.positional.size(); ++i) {
    rest.positional.push_back(a.positional[i]);
  }
  return ApplyTest(test->AsString(), item, rest);
}

constexpr const char* kFilters[] = {
    "safe",   "tojson",     "trim",       "length",     "count", "string",   "lower", "upper",
    "title",  "replace",    "indent",     "escape",     "e",     "default",  "d",     "first",
    "last",   "list",       "reverse",    "items",      "join",  "int",      "float", "abs",
    "sum",    "sort",       "unique",     "min",        "max",   "dictsort", "map",   "select",
    "reject", "selectattr", "rejectattr", "capitalize", "format"};
constexpr const char* kTests[] = {"defined",     "undefined", "none",     "string",      "mapping",
                                  "number",      "integer",   "float",    "boolean",     "true",
                                  "false",       "callable",  "iterable", "sequence",    "lower",
                                  "upper",       "even",      "odd",      "divisibleby", "eq",
                                  "equalto",     "==",        "ne",       "!=",          "lt",
                                  "lessthan",    "<",         "le",       "<=",          "gt",
                                  "greaterthan", ">",         "ge",       ">=",          "in",
                                  "sameas"};

}  // namespace

bool IsFilter(const std::string& name) {
  for (const char* f : kFilters) {
    if (name == f) return true;
  }
  return false;
}

bool IsTest(const std::string& name) {
  for (const char* t : kTests) {
    if (name == t) return true;
  }
  return false;
}

Expected<Value> GetAttr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      return InvalidArgument(obj.undefined_name().empty()
                                 ? "undefined value has no attribute '" + name + "'"
                                 : "'" + obj.undefined_name() + "' is undefined");
    case Value::Kind::kString:
      if (auto m = StringMethod(obj.AsString(), name)) return *m;
      break;
    case Value::Kind::kDict:
      if (!obj.AsDict().is_namespace) {
        if (auto m = DictMethod(obj, name)) return *m;
      }
      if (const Value* v = obj.AsDict().Find(name)) return *v;
      break;
    default:
      break;
  }
  return Value::MakeUndefined(name);
}

Expected<Value> GetItem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      return InvalidArgument(obj.undefined_name().empty()
                                 ? "undefined value has no item " + key.Repr()
                                 : "'" + obj.undefined_name() + "' is undefined");
    case Value::Kind::kDict:
      if (key.IsString()) {
        if (const Value* v = obj.AsDict().Find(key.AsString())) return *v;
      }
      break;
    case Value::Kind::kList:
    case Value::Kind::kString:
      if (obj.IsGenerator()) break;
      if (key.IsInt() || key.IsBool()) {
        int64_t i = key.AsInt();
        if (obj.IsList()) {
          int64_t n = static_cast<int64_t>(obj.AsList().size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return obj.AsList()[static_cast<size_t>(i)];
        } else {
          Cps c = DecodeUtf8(obj.AsString());
          int64_t n = static_cast<int64_t>(c.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value(EncodeUtf8({c[static_cast<size_t>(i)]}));
        }
      } else if (key.IsString()) {
        return GetAttr(obj, key.AsString());
      }
      break;
    default:
      break;
  }
  return Value::MakeUndefined(key.Str());
}

Expected<Value> GetSlice(const Value& obj, const Value* start, const Value* stop,
                         const Value* step) {
  if ((!obj.IsList() && !obj.IsString()) || obj.IsGenerator()) {
    if (obj.IsUndefined()) return InvalidArgument("'" + obj.undefined_name() + "' is undefined");
    return Value::MakeUndefined("");
  }
  GZ_ASSIGN_OR_RETURN(int64_t st, IntArg(step, 1, "slice step"));
  if (st == 0) return InvalidArgument("slice step cannot be zero");
  bool ascii = obj.IsString() && IsAscii(obj.AsString());
  Cps cps;
  if (obj.IsString() && !ascii) cps = DecodeUtf8(obj.AsString());
  int64_t n = obj.IsList() ? static_cast<int64_t>(obj.AsList().size())
              : ascii      ? static_cast<int64_t>(obj.AsString().size())
                           : static_cast<int64_t>(cps.size());
  auto clamp = [&](const Value* v, int64_t fallback) -> Expected<int64_t> {
    if (v == nullptr || v->IsNone()) return fallback;
    GZ_ASSIGN_OR_RETURN(int64_t i, IntArg(v, 0, "slice index"));
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  GZ_ASSIGN_OR_RETURN(int64_t b, clamp(start, st > 0 ? 0 : n - 1));
  GZ_ASSIGN_OR_RETURN(int64_t e, clamp(stop, st > 0 ? n : -1));
  std::vector<int64_t> picks;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) picks.push_back(i);
  if (obj.IsList()) {
    List out;
    for (int64_t i : picks) out.push_back(obj.AsList()[static_cast<size_t>(i)]);
    return Value::MakeList(std::move(out));
  }
  std::string out;
  for (int64_t i : picks) {
    if (ascii) {
      out += obj.AsString()[static_cast<size_t>(i)];
    } else {
      AppendUtf8(cps[static_cast<size_t>(i)], out);
    }
  }
  return Value(std::move(out));
}

Expected<List> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return List{};
    case Value::Kind::kList:
      return v.AsList();
    case Value::Kind::kDict: {
      if (v.AsDict().is_namespace) break;
      List l;
      for (const auto& [k, x] : v.AsDict().items) l.push_back(Value(k));
      return l;
    }
    case Value::Kind::kString: {
      List l;
      for (char32_t c : DecodeUtf8(v.AsString())) l.push_back(Value(EncodeUtf8({c})));
      return l;
    }
    default:
      break;
  }
  return TypeError("'" + v.TypeName() + "' object is not iterable");
}

Expected<Value> BinaryOp(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return Value(Equals(a, b));
  if (op == "!=") return Value(!Equals(a, b));
  if (op == "~") return Value(a.Str() + b.Str());
  if (op == "in" || op == "notin") {
    bool found = false;
    if (b.IsString()) {
      if (!a.IsString()) {
        return TypeError("'in <string>' requires string as left operand, not " + a.TypeName());
      }
      found = b.AsString().find(a.AsString()) != std::string::npos;
    } else if (b.IsDict() && !b.AsDict().is_namespace) {
      if ((a.IsList() && !a.IsTuple()) || a.IsDict()) {
        return TypeError("unhashable type: '" + a.TypeName() + "'");
      }
      found = a.IsString() && b.AsDict().Find(a.AsString()) != nullptr;
    } else if (b.IsList()) {
      for (const Value& x : b.AsList()) {
        if (Equals(x, a)) {
          found = true;
          break;
        }
      }
    } else if (!b.IsUndefined()) {
      return TypeError("argument of type '" + b.TypeName() + "' is not iterable");
    }
    return Value(op == "in" ? found : !found);
  }
  if (op == "<" || op == "<=" || op == ">" || op == ">=") {
    Status error;
    bool r;
    if (op == "<") {
      r = Less(a, b, &error);
    } else if (op == ">") {
      r = Less(b, a, &error);
    } else if (op == "<=") {
      r = !Less(b, a, &error);
    } else {
      r = !Less(a, b, &error);
    }
    if (!error.ok()) {
      // As Python: the error names the items that could not be ordered, inside lists too.
      if (error.message().rfind("'<' not supported", 0) != 0) return error;
      return TypeError("'" + op + "' not supported between instances of '" + a.TypeName() +
                       "' and '" + b.TypeName() + "'");
    }
    return Value(r);
  }
  auto unsupported = [&]() {
    if (a.IsUndefined() || b.IsUndefined()) {
      const Value& u = a.IsUndefined() ? a : b;
      return TypeError("'" + u.undefined_name() + "' is undefined");
    }
    return TypeError("unsupported operand type(s) for " + op + ": '" + a.TypeName() + "' and '" +
                     b.TypeName() + "'");
  };
  if (a.IsNumber() && b.IsNumber()) {
    bool as_float = a.IsFloat() || b.IsFloat();
    if (op == "+")
      return as_float ? Value(a.AsDouble() + b.AsDouble()) : Value(a.AsInt() + b.AsInt());
    if (op == "-")
      return as_float ? Value(a.AsDouble() - b.AsDouble()) : Value(a.AsInt() - b.AsInt());
    if (op == "*")
      return as_float ? Value(a.AsDouble() * b.AsDouble()) : Value(a.AsInt() * b.AsInt());
    if (op == "/") {
      if (b.AsDouble() == 0) return InvalidArgument("division by zero");
      return Value(a.AsDouble() / b.AsDouble());
    }
    if (op == "//" || op == "%") {
      if (b.AsDouble() == 0) return InvalidArgument("integer division or modulo by zero");
      if (as_float) {
        // CPython's float_divmod, so that 2.5 // 0.1 is 24.0 as in Python.
        double vx = a.AsDouble(), wx = b.AsDouble();
        double mod = std::fmod(vx, wx);
        double div = (vx - mod) / wx;
        if (mod != 0) {
          if ((wx < 0) != (mod < 0)) {
            mod += wx;
            div -= 1.0;
          }
        } else {
          mod = std::copysign(0.0, wx);
        }
        double floordiv = 0;
        if (div != 0) {
          floordiv = std::floor(div);
          if (div - floordiv > 0.5) floordiv += 1.0;
        } else {
          floordiv = std::copysign(0.0, vx / wx);
        }
        return op == "//" ? Value(floordiv) : Value(mod);
      }
      int64_t x = a.AsInt(), y = b.AsInt();
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return op == "//" ? Value(q) : Value(x - q * y);
    }
    if (op == "**") {
      if (!as_float && b.AsInt() >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < b.AsInt(); ++i) r *= a.AsInt();
        return Value(r);
      }
      return Value(std::pow(a.AsDouble(), b.AsDouble()));
    }
    return unsupported();
  }
  if (op == "+") {
    if (a.IsString() && b.IsString()) return Value(a.AsString() + b.AsString());
    if (a.IsList() && b.IsList() && !a.IsGenerator() && !b.IsGenerator() &&
        a.IsTuple() == b.IsTuple()) {
      List l = a.AsList();
      l.insert(l.end(), b.AsList().begin(), b.AsList().end());
      return a.IsTuple() ? Value::MakeTuple(std::move(l)) : Value::MakeList(std::move(l));
    }
  }
  if (op == "*") {
    const Value& seq = a.IsNumber() ? b : a;
    const Value& times = a.IsNumber() ? a : b;
    if ((times.IsInt() || times.IsBool()) && (seq.IsString() || seq.IsList()) &&
        !seq.IsGenerator()) {
      int64_t n = std::max<int64_t>(times.AsInt(), 0);
      size_t unit = seq.IsString() ? seq.AsString().size() : seq.AsList().size();
      if (unit > 0 && static_cast<uint64_t>(n) > (uint64_t{1} << 26) / unit) {
        return InvalidArgument("repetition result too large");
      }
      if (seq.IsString()) {
        std::string out;
        out.reserve(static_cast<size_t>(n) * unit);
        for (int64_t i = 0; i < n; ++i) out += seq.AsString();
        return Value(std::move(out));
      }
      List out;
      for (int64_t i = 0; i < n; ++i)
        out.insert(out.end(), seq.AsList().begin(), seq.AsList().end());
      return seq.IsTuple() ? Value::MakeTuple(std::move(out)) : Value::MakeList(std::move(out));
    }
  }
  if (op == "%" && a.IsString()) return PercentFormat(a.AsString(), b);
  return unsupported();
}

Expected<bool> ApplyTest(const std::string& name, const Value& v, const Args& a) {
  using K = Value::Kind;
  if (name == "defined") return !v.IsUndefined();
  if (name == "undefined") return v.IsUndefined();
  if (name == "none") return v.IsNone();
  if (name == "string") return v.IsString();
  if (name == "mapping") return v.IsDict() && !v.AsDict().is_namespace;
  if (name == "number") return v.IsNumber();
  if (name == "integer") return v.IsInt();
  if (name == "float") return v.IsFloat();
  if (name == "boolean") return v.IsBool();
  if (name == "true") return v.IsBool() && v.AsBool();
  if (name == "false") return v.IsBool() && !v.AsBool();
  if (name == "callable") return v.IsCallable();
  if (name == "iterable") {
    return v.kind() == K::kUndefined || v.IsList() || v.IsString() ||
           (v.IsDict() && !v.AsDict().is_namespace);
  }
  if (name == "sequence") {
    return v.kind() == K::kUndefined || (v.IsList() && !v.IsGenerator()) || v.IsString() ||
           (v.IsDict() && !v.AsDict().is_namespace);
  }
  if (name == "lower" || name == "upper") {
    if (!v.IsString()) return false;
    return name == "lower" ? Lower(v.AsString()) == v.AsString()
                           : Upper(v.AsString()) == v.AsString();
  }
  if (name == "even" || name == "odd") {
    if (!v.IsNumber()) return TypeError("even/odd test needs a number");
    GZ_ASSIGN_OR_RETURN(Value rem, BinaryOp("%", v, Value(int64_t{2})));
    return name == "even" ? Equals(rem, Value(int64_t{0})) : Equals(rem, Value(int64_t{1}));
  }
  if (name == "divisibleby") {
    GZ_ASSIGN_OR_RETURN(int64_t n, IntArg(a.Get(0, "num"), 0, "divisibleby"));
    if (n == 0 || !(v.IsInt() || v.IsBool())) return TypeError("divisibleby needs integers");
    return v.AsInt() % n == 0;
  }
  static const char* kCompare[][2] = {
      {"eq", "=="}, {"equalto", "=="}, {"==", "=="},      {"ne", "!="},
      {"!=", "!="}, {"lt", "<"},       {"lessthan", "<"}, {"<", "<"},
      {"le", "<="}, {"<=", "<="},      {"gt", ">"},       {"greaterthan", ">"},
      {">", ">"},   {"ge", ">="},      {">=", ">="},      {"in", "in"}};
  for (const auto& [test, op] : kCompare) {
    if (name == test) {
      const Value* other = a.Get(0, "b");
      if (other == nullptr) return TypeError("test '" + name + "' needs an argument");
      GZ_ASSIGN_OR_RETURN(Value r, BinaryOp(op, v, *other));
      return r.Truthy();
    }
  }
  if (name == "sameas") {
    const Value* other = a.Get(0, "other");
    if (other == nullptr) return TypeError("test 'sameas' needs an argument");
    if (v.IsNone() || v.IsBool() || other->IsNone() || other->IsBool()) {
      return v.kind() == other->kind() && Equals(v, *other);
    }
    if (v.IsList() && other->IsList()) return v.list_ptr() == other->list_ptr();
    if (v.IsDict() && other->IsDict()) return v.dict_ptr() == other->dict_ptr();
    return false;
  }
  return Unimplemented("unsupported test '" + name + "'");
}

Expected<Value> ApplyFilter(const std::string& name, const Value& v, const Args& a) {
  if (name == "safe") return v;
  if (name == "format") {
    // Jinja formats with the keyword arguments as a dict when there are any, else with the
    // positional ones as a tuple.
    if (!a.keyword.empty()) {
      Value kwargs = Value::MakeDict();
      for (const auto& [k, x] : a.keyword) kwargs.AsDict().Set(k, x);
      return PercentFormat(v.Str(), kwargs);
    }
    return PercentFormat(v.Str(), Value::MakeTuple(a.positional));
  }
  if (name == "tojson") {
    const Value* indent = a.Get(1, "indent");
    bool ensure_ascii = ArgTruthy(a.Get(0, "ensure_ascii"), false);
    if (const Value* sort = a.Get(3, "sort_keys"); sort != nullptr && sort->Truthy()) {
      return Unimplemented("tojson with sort_keys is not supported");
    }
    if (const Value* sep = a.Get(2, "separators"); sep != nullptr && !sep->IsNone()) {
      return Unimplemented("tojson with separators is not supported");
    }
    std::optional<std::string> ind;
    if (indent != nullptr && !indent->IsNone()) {
      if (indent->IsString()) {
        ind = indent->AsString();
      } else {
        GZ_ASSIGN_OR_RETURN(int64_t n, IntArg(indent, 0, "indent"));
        ind = std::string(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
      }
    }
    GZ_ASSIGN_OR_RETURN(std::string s, ToJson(v, ind, ensure_ascii));
    return Value(std::move(s));
  }
  if (name == "trim") {
    const Value* chars = a.Get(0, "chars");
    const std::string* cs = chars != nullptr && chars->IsString() ? &chars->AsString() : nullptr;
    return Value(Strip(v.Str(), cs, true, true));
  }
  if (name == "length" || name == "count") return Length(v);
  if (name == "string") return Value(v.Str());
  if (name == "lower") return Value(Lower(v.Str()));
  if (name == "upper") return Value(Upper(v.Str()));
  if (name == "capitalize") return Value(Capitalize(v.Str()));
  if (name == "title") return Value(JinjaTitle(v.Str()));
  if (name == "replace") {
    GZ_ASSIGN_OR_RETURN(std::string old, StrArg(a.Get(0, "old"), "replace old"));
    GZ_ASSIGN_OR_RETURN(std::string repl, StrArg(a.Get(1, "new"), "replace new"));
    GZ_ASSIGN_OR_RETURN(int64_t count, IntArg(a.Get(2, "count"), -1, "count"));
    return Value(Replace(v.Str(), old, repl, count));
  }
  if (name == "indent") {
    if (!v.IsString()) {
      return TypeError("unsupported operand type(s) for +=: '" + v.TypeName() + "' and 'str'");
    }
    return IndentFilter(v.AsString(), a);
  }
  if (name == "escape" || name == "e") {
    std::string out;
    for (char c : v.Str()) {
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&#34;";
          break;
        case '\'':
          out += "&#39;";
          break;
        default:
          out += c;
      }
    }
    return Value(std::move(out));
  }
  if (name == "default" || name == "d") {
    const Value* fallback = a.Get(0, "default_value");
    bool boolean = ArgTruthy(a.Get(1, "boolean"), false);
    if (v.IsUndefined() || (boolean && !v.Truthy())) {
      return fallback != nullptr ? *fallback : Value("");
    }
    return v;
  }
  if (name == "first" || name == "last") {
    if (v.IsString()) {
      Cps c = DecodeUtf8(v.AsString());
      if (c.empty()) return Value::MakeUndefined(name);
      return Value(EncodeUtf8({name == "first" ? c.front() : c.back()}));
    }
    if (name == "last" && v.IsGenerator()) return TypeError("'generator' object is not reversible");
    GZ_ASSIGN_OR_RETURN(List l, Iterate(v));
    if (l.empty()) return Value::MakeUndefined(name);
    return name == "first" ? l.front() : l.back();
  }
  if (name == "list") {
    GZ_ASSIGN_OR_RETURN(List l, Iterate(v));
    return Value::MakeList(std::move(l));
  }
  if (name == "reverse") {
    if (v.IsString()) {
      Cps c = DecodeUtf8(v.AsString());
      std::reverse(c.begin(), c.end());
      return Value(EncodeUtf8(c));
    }
    // reversed() of a list is an iterator; a generator cannot be reversed, so Jinja makes a list.
    bool was_generator = v.IsGenerator();
    GZ_ASSIGN_OR_RETURN(List l, Iterate(v));
    std::reverse(l.begin(), l.end());
    return was_generator ? Value::MakeList(std::move(l)) : Value::MakeGenerator(std::move(l));
  }
  if (name == "items") {
    if (v.IsUndefined()) return Value::MakeList();
    if (!v.IsDict()) return TypeError("can only get item pairs from a mapping");
    List l;
    for (const auto& [k, x] : v.AsDict().items) l.push_back(Value::MakeTuple({Value(k), x}));
    return Value::MakeGenerator(std::move(l));
  }
  if (name == "join") {
    std::string sep = a.Get(0, "d") != nullptr ? a.Get(0, "d")->Str() : "";
    const Value* attribute = a.Get(1, "attribute");
    GZ_ASSIGN_OR_RETURN(List l, Iterate(v));
    std::string out;
    for (size_t i = 0; i < l.size(); ++i) {
      if (i > 0) out += sep;
      if (attribute != nullptr && !attribute->IsNone()) {
        GZ_ASSIGN_OR_RETURN(Value x, GetPath(l[i], attribute->Str()));
        out += x.Str();
      } else {
        out += l[i].Str();
      }
    }
    return Value(std::move(out));
  }
  if ((name == "int" || name == "float") && v.IsUndefined()) {
    return InvalidArgument("'" + v.undefined_name() + "' is undefined");
  }
  if (name == "int") {
    const Value* fallback = a.Get(0, "default");
    Value def = fallback != nullptr ? *fallback : Value(int64_t{0});
    if (v.IsInt() || v.IsBool()) return Value(v.AsInt());
    if (v.IsFloat())
      return std::isfinite(v.AsDouble()) ? Value(static_cast<int64_t>(v.AsDouble())) : def;
    if (v.IsString()) {
      std::string s = Strip(v.AsString(), nullptr, true, true);
      int64_t i = 0;
      const char* b = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
      auto r = std::from_chars(b, s.data() + s.size(), i);
      if (!s.empty() && r.ec == std::errc() && r.ptr == s.data() + s.size()) return Value(i);
      char* end = nullptr;
      double f = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(f)) {
        return Value(static_cast<int64_t>(f));
      }
    }
    return def;
  }
  if (name == "float") {
    const Value* fallback = a.Get(0, "default");
    Value def = fallback != nullptr ? *fallback : Value(0.0);
    if (v.IsNumber()) return Value(v.AsDouble());
    if (v.IsString()) {
      std::string s = Strip(v.AsString(), nullptr, true, true);
      char* end = nullptr;
      double f = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size()) return Value(f);
    }
    return def;
  }
  if (name == "abs") {
    if (v.IsFloat()) return Value(std::fabs(v.AsDouble()));
    if (v.IsInt() || v.IsBool()) return Value(v.AsInt() < 0 ? -v.AsInt() : v.AsInt());
    return TypeError("bad operand type for abs(): '" + v.TypeName() + "'");
  }
  if (name == "sum") {
    const Value* attribute = a.Get(0, "attribute");
    Value total = a.Get(1, "start") != nullptr ? *a.Get(1, "start") : Value(int64_t{0});
    GZ_ASSIGN_OR_RETURN(List l, Iterate(v));
    for (const Value& x : l) {
      Value item = x;
      if (attribute != nullptr && !attribute->IsNone()) {
        GZ_ASSIGN_OR_RETURN(item, GetPath(x, attribute->Str()));
      }
      GZ_ASSIGN_OR_RETURN(total, BinaryOp("+", total, item));
    }
    return total;
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max" || name == "dictsort") {
    bool is_sort = name == "sort";
    bool is_dictsort = name == "dictsort";
    const Value* reverse_arg = is_sort       ? a.Get(0, "reverse")
                               : is_dictsort ? a.Get(2, "reverse")
                                             : nullptr;
    bool reverse = ArgTruthy(reverse_arg, false);
    bool case_sensitive = ArgTruthy(a.Get(is_sort ? 1 : 0, "case_sensitive"), false);
    const Value* attribute = is_dictsort ? nullptr : a.Get(is_sort ? 2 : 1, "attribute");
    List l;
    if (is_dictsort) {
      if (!v.IsDict()) return TypeError("dictsort needs a mapping");
      std::string by = a.Get(1, "by") != nullptr ? a.Get(1, "by")->Str() : "key";
      for (const auto& [k, x] : v.AsDict().items) l.push_back(Value::MakeTuple({Value(k), x}));
      static const Value kIndex[2] = {Value(int64_t{0}), Value(int64_t{1})};
      attribute = &kIndex[by == "value" ? 1 : 0];
    } else {
      GZ_ASSIGN_OR_RETURN(l, Iterate(v));
    }
    std::vector<Value> keys;
    for (const Value& x : l) {
      Value key = x;
      if (attribute != nullptr && !attribute->IsNone()) {
        if (attribute->IsInt()) {
          GZ_ASSIGN_OR_RETURN(key, GetItem(x, *attribute));
        } else {
          GZ_ASSIGN_OR_RETURN(key, GetPath(x, attribute->Str()));
        }
      }
      if (!case_sensitive && key.IsString()) key = Value(Lower(key.AsString()));
      keys.push_back(std::move(key));
    }
    if (name == "unique") {
      for (const Value& k : keys) {
        if ((k.IsList() && !k.IsTuple()) || k.IsDict()) {
          return TypeError("unhashable type: '" + k.TypeName() + "'");
        }
      }
      List out;
      std::vector<Value> seen;
      for (size_t i = 0; i < l.size(); ++i) {
        bool dup = false;
        for (const Value& s : seen) dup = dup || Equals(s, keys[i]);
        if (!dup) {
          seen.push_back(keys[i]);
          out.push_back(l[i]);
        }
      }
      return Value::MakeGenerator(std::move(out));
    }
    std::vector<size_t> order(l.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    Status error;
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      return reverse ? Less(keys[y], keys[x], &error) : Less(keys[x], keys[y], &error);
    });
    if (!error.ok()) return error;
    if (name == "min" || name == "max") {
      if (order.empty()) return Value::MakeUndefined(name);
      return l[name == "min" ? order.front() : order.back()];
    }
    List out;
    for (size_t i : order) out.push_back(l[i]);
    return Value::MakeList(std::move(out));
  }
  if (name == "map") {
    GZ_ASSIGN_OR_RETURN(List l, Iterate(v));
    List out;
    const Value* attribute = nullptr;
    for (const auto& [k, x] : a.keyword) {
      if (k == "attribute") attribute = &x;
    }
    if (attribute != nullptr) {
      const Value* fallback = nullptr;
      for (const auto& [k, x] : a.keyword) {
        if (k == "default") fallback = &x;
      }
      for (const Value& x : l) {
        GZ_ASSIGN_OR_RETURN(Value item, GetPath(x, attribute->Str()));
        if (item.IsUndefined() && fallback != nullptr) item = *fallback;
        out.push_back(std::move(item));
      }
      return Value::MakeGenerator(std::move(out));
    }
    if (a.positional.empty() || !a.positional[0].IsString()) {
      return TypeError("map needs a filter name or attribute=");
    }
    Args rest;
    rest.positional.assign(a.positional.begin() + 1, a.positional.end());
    rest.keyword = a.keyword;
    for (const Value& x : l) {
      GZ_ASSIGN_OR_RETURN(Value item, ApplyFilter(a.positional[0].AsString(), x, rest));
      out.push_back(std::move(item));
    }
    return Value::MakeGenerator(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    bool keep_match = name == "select" || name == "selectattr";
    bool by_attr = name == "selectattr" || name == "rejectattr";
    GZ_ASSIGN_OR_RETURN(List l, Iterate(v));
    List out;
    std::string attr;
    if (by_attr) {
      if (a.positional.empty()) return TypeError(name + " needs an attribute name");
      attr = a.positional[0].Str();
    }
    for (const Value& x : l) {
      Value item = x;
      if (by_attr) {
        GZ_ASSIGN_OR_RETURN(item, GetPath(x, attr));
      }
      GZ_ASSIGN_OR_RETURN(bool match, TestMatches(item, a, by_attr ? 1 : 0, true));
      if (match == keep_match) out.push_back(x);
    }
    return Value::MakeGenerator(std::move(out));
  }
  return Unimplemented("unsupported filter '" + name + "'");
}

Dict MakeGlobals() {
  Dict g;
  g.Set("range", Method("range", [](const Args& a) -> Expected<Value> {
          int64_t start = 0, stop = 0, step = 1;
          std::vector<int64_t> n;
          for (const Value& x : a.positional) {
            if (!x.IsInt() && !x.IsBool()) return TypeError("range() needs integers");
            n.push_back(x.AsInt());
          }
          if (n.size() == 1) {
            stop = n[0];
          } else if (n.size() == 2 || n.size() == 3) {
            start = n[0];
            stop = n[1];
            if (n.size() == 3) step = n[2];
          } else {
            return TypeError("range expected 1 to 3 arguments");
          }
          if (step == 0) return InvalidArgument("range() arg 3 must not be zero");
          List l;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (l.size() >= 100000) return InvalidArgument("range too big");
            l.push_back(Value(i));
          }
          return Value::MakeList(std::move(l));
        }));
  auto make_dict = [](bool ns) {
    return [ns](const Args& a) -> Expected<Value> {
      Value d = Value::MakeDict();
      d.AsDict().is_namespace = ns;
      for (const Value& x : a.positional) {
        if (!x.IsDict()) return TypeError("expected a mapping argument");
        for (const auto& [k, v] : x.AsDict().items) d.AsDict().Set(k, v);
      }
      for (const auto& [k, v] : a.keyword) d.AsDict().Set(k, v);
      return d;
    };
  };
  g.Set("dict", Method("dict", make_dict(false)));
  g.Set("namespace", Method("namespace", make_dict(true)));
  g.Set("raise_exception", Method("raise_exception", [](const Args& a) -> Expected<Value> {
          const Value* m = a.Get(0, "message");
          return InvalidArgument("raise_exception: " + (m != nullptr ? m->Str() : ""));
        }));
  g.Set("strftime_now", Method("strftime_now", [](const Args& a) -> Expected<Value> {
          GZ_ASSIGN_OR_RETURN(std::string fmt, StrArg(a.Get(0, "format"), "strftime_now format"));
          std::time_t now = std::time(nullptr);
          std::tm tm{};
          localtime_r(&now, &tm);
          char buf[256];
          size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
          return Value(std::string(buf, n));
        }));
  return g;
}

}  // namespace gizllm::jinja
