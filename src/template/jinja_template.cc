// The tree-walking renderer.
#include <string>
#include <utility>

#include "template/jinja.h"
#include "template/jinja_builtins.h"
#include "template/jinja_parser.h"
#include "template/jinja_scopes.h"

namespace gizllm::jinja {

namespace {

// Names visible at one point: a for-loop iteration or a macro call opens a frame; if and set
// do not, so a set inside a loop stays in the loop, as in Jinja.
struct Frame {
  Dict vars;
  const Frame* parent = nullptr;

  // Shadows outer values of the names the scope owns until it assigns them.
  void MarkUndefined(const std::vector<std::string>& names) {
    for (const std::string& n : names) vars.Set(n, Value::MakeUndefined(n));
  }

  const Value* Find(const std::string& name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent) {
      if (const Value* v = f->vars.Find(name)) return v;
    }
    return nullptr;
  }
};

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const Frame* root, const RenderLimits& limits) : root_(root), limits_(limits) {}
  // Values are shared pointers: a namespace given itself as an attribute (directly or inside a
  // list) is a cycle no count frees. Every cycle passes through a namespace attribute set here,
  // so clearing those namespaces when the render ends frees them all.
  ~Renderer() {
    for (const DictPtr& ns : namespaces_) ns->items.clear();
  }

  Status Exec(const Body& body, Frame& frame, std::string& out, Flow& flow) {
    for (const NodePtr& node : body) {
      if (++steps_ > limits_.steps) return Fail(node->pos, StepsExceeded());
      GZ_RETURN_IF_ERROR(ExecNode(*node, frame, out, flow));
      if (flow != Flow::kNormal) return Status::Ok();
    }
    return Status::Ok();
  }

  Expected<Value> Eval(const Expr& e, Frame& frame) {
    Expected<Value> v =
        ++steps_ > limits_.steps ? Expected<Value>(StepsExceeded()) : EvalInner(e, frame);
    if (v.ok()) {
      // What an expression makes counts too: a string's bytes, a list's or a dict's items.
      Status counted;
      if (v->IsString()) {
        counted = CountText(e.pos, v->AsString().size(), v->AsString().size());
      } else if ((v->IsList() || v->IsDict()) && MakesValue(e.kind)) {
        steps_ += static_cast<int64_t>(v->IsList() ? v->AsList().size() : v->AsDict().items.size());
        if (steps_ > limits_.steps) counted = StepsExceeded();
      }
      if (!counted.ok()) v = counted;
    }
    if (!v.ok() && !positioned_) {
      positioned_ = true;
      return Status(v.status().code(), FormatPos(e.pos) + ": " + v.status().message());
    }
    return v;
  }

  // Errors are prefixed with the position of the innermost construct that failed, once.
  bool positioned_ = false;

 private:
  // Whether an expression of this kind makes a new list or dict (rather than naming one that
  // exists: lists and dicts are shared, so naming one costs nothing).
  static bool MakesValue(Expr::Kind kind) {
    switch (kind) {
      case Expr::Kind::kList:
      case Expr::Kind::kTuple:
      case Expr::Kind::kDict:
      case Expr::Kind::kSlice:
      case Expr::Kind::kBinary:
      case Expr::Kind::kCall:
      case Expr::Kind::kFilter:
        return true;
      default:
        return false;
    }
  }

  Status StepsExceeded() const {
    return InvalidArgument("the template's rendering passed its bound of " +
                           std::to_string(limits_.steps) + " steps");
  }

  // Counts `made` new bytes of text and checks the text they went into, `length` long.
  Status CountText(const Pos& pos, size_t made, size_t length) {
    bytes_ += static_cast<int64_t>(made);
    if (static_cast<int64_t>(length) > limits_.longest) {
      return Fail(pos, InvalidArgument("the template's rendering made a text longer than " +
                                       std::to_string(limits_.longest) + " bytes"));
    }
    if (bytes_ > limits_.bytes) {
      return Fail(pos, InvalidArgument("the template's rendering passed its bound of " +
                                       std::to_string(limits_.bytes) + " bytes of text"));
    }
    return Status::Ok();
  }

  Status Append(const Pos& pos, std::string_view text, std::string& out) {
    out += text;
    return CountText(pos, text.size(), out.size());
  }

  Status Fail(const Pos& pos, Status s) {
    if (positioned_ || s.ok()) return s;
    positioned_ = true;
    return Status(s.code(), FormatPos(pos) + ": " + s.message());
  }

  Status ExecNode(const Node& n, Frame& frame, std::string& out, Flow& flow) {
    switch (n.kind) {
      case Node::Kind::kText:
        return Append(n.pos, n.text, out);
      case Node::Kind::kOutput: {
        GZ_ASSIGN_OR_RETURN(Value v, Eval(*n.expr, frame));
        return Append(n.pos, v.Str(), out);
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          bool take = true;
          if (cond) {
            GZ_ASSIGN_OR_RETURN(Value c, Eval(*cond, frame));
            take = c.Truthy();
          }
          if (take) return Exec(body, frame, out, flow);
        }
        return Status::Ok();
      case Node::Kind::kFor:
        return ExecFor(n, frame, out);
      case Node::Kind::kSet: {
        GZ_ASSIGN_OR_RETURN(Value v, Eval(*n.expr, frame));
        if (!n.attr.empty()) {
          const Value* target = frame.Find(n.targets[0]);
          if (target == nullptr || !target->IsDict() || !target->AsDict().is_namespace) {
            return Fail(n.pos, InvalidArgument("cannot assign attribute on non-namespace object '" +
                                               n.targets[0] + "'"));
          }
          if (namespaces_.empty() || namespaces_.back() != target->dict_ptr()) {
            namespaces_.push_back(target->dict_ptr());
          }
          target->AsDict().Set(n.attr, std::move(v));
          return Status::Ok();
        }
        return Assign(n.targets, v, frame, n.pos);
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        Flow inner = Flow::kNormal;
        Frame block{{}, &frame};
        block.MarkUndefined(n.scope_undefined);
        GZ_RETURN_IF_ERROR(Exec(n.body, block, captured, inner));
        frame.vars.Set(n.targets[0], Value(std::move(captured)));
        return Status::Ok();
      }
      case Node::Kind::kMacro:
        frame.vars.Set(n.name, MakeMacro(n, nullptr));
        return Status::Ok();
      case Node::Kind::kCallBlock: {
        // caller() renders the block's body with the block's frame.
        Value caller = MakeMacro(n, &frame);
        const Expr& call = *n.expr;
        GZ_ASSIGN_OR_RETURN(Value callee, Eval(*call.children[0], frame));
        GZ_ASSIGN_OR_RETURN(Args args, EvalArgs(call, frame, 1));
        args.keyword.emplace_back("caller", caller);
        if (!callee.IsCallable()) {
          return Fail(n.pos, InvalidArgument("'" + callee.TypeName() + "' object is not callable"));
        }
        Expected<Value> r = callee.AsCallable().call(args);
        if (!r.ok()) return Fail(n.pos, r.status());
        return Append(n.pos, r->Str(), out);
      }
      case Node::Kind::kBreak:
        flow = Flow::kBreak;
        return Status::Ok();
      case Node::Kind::kContinue:
        flow = Flow::kContinue;
        return Status::Ok();
      case Node::Kind::kScope:
        return Exec(n.body, frame, out, flow);
      case Node::Kind::kFilterBlock: {
        std::string captured;
        Frame block{{}, &frame};
        block.MarkUndefined(n.scope_undefined);
        GZ_RETURN_IF_ERROR(Exec(n.body, block, captured, flow));
        GZ_ASSIGN_OR_RETURN(Args args, EvalArgs(*n.expr, frame, 1));
        Expected<Value> filtered = ApplyFilter(n.expr->name, Value(std::move(captured)), args);
        if (!filtered.ok()) return Fail(n.expr->pos, filtered.status());
        return Append(n.pos, filtered->Str(), out);
      }
    }
    return Status::Ok();
  }

  Status Assign(const std::vector<std::string>& targets, const Value& v, Frame& frame,
                const Pos& pos) {
    if (targets.size() == 1) {
      frame.vars.Set(targets[0], v);
      return Status::Ok();
    }
    Expected<List> items = Iterate(v);
    if (!items.ok()) return Fail(pos, items.status());
    if (items->size() != targets.size()) {
      return Fail(
          pos, InvalidArgument("cannot unpack " + std::to_string(items->size()) + " values into " +
                               std::to_string(targets.size()) + " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i) frame.vars.Set(targets[i], (*items)[i]);
    return Status::Ok();
  }

  Status ExecFor(const Node& n, Frame& frame, std::string& out) {
    GZ_ASSIGN_OR_RETURN(Value iterable, Eval(*n.expr, frame));
    Expected<List> all = Iterate(iterable);
    if (!all.ok()) return Fail(n.expr->pos, all.status());
    List items;
    if (n.condition) {
      // "for x in y if cond": the loop counts only the items that pass.
      for (const Value& item : *all) {
        Frame probe{{}, &frame};
        GZ_RETURN_IF_ERROR(Assign(n.targets, item, probe, n.pos));
        GZ_ASSIGN_OR_RETURN(Value keep, Eval(*n.condition, probe));
        if (keep.Truthy()) items.push_back(item);
      }
    } else {
      items = std::move(*all);
    }
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      Frame inner{{}, &frame};
      inner.MarkUndefined(n.scope_undefined);
      Value loop = Value::MakeDict();
      Dict& l = loop.AsDict();
      l.items.reserve(10);
      l.items.emplace_back("index", Value(i + 1));
      l.items.emplace_back("index0", Value(i));
      l.items.emplace_back("revindex", Value(length - i));
      l.items.emplace_back("revindex0", Value(length - i - 1));
      l.items.emplace_back("first", Value(i == 0));
      l.items.emplace_back("last", Value(i == length - 1));
      l.items.emplace_back("length", Value(length));
      l.items.emplace_back("depth", Value(1));
      l.items.emplace_back("depth0", Value(0));
      if (i > 0) l.items.emplace_back("previtem", items[i - 1]);
      if (i + 1 < length) l.items.emplace_back("nextitem", items[i + 1]);
      inner.vars.items.emplace_back("loop", std::move(loop));
      GZ_RETURN_IF_ERROR(Assign(n.targets, items[i], inner, n.pos));
      Flow flow = Flow::kNormal;
      GZ_RETURN_IF_ERROR(Exec(n.body, inner, out, flow));
      if (flow == Flow::kBreak) break;
    }
    if (length == 0 && !n.else_body.empty()) {
      Frame inner{{}, &frame};
      inner.MarkUndefined(n.else_undefined);
      Flow flow = Flow::kNormal;
      GZ_RETURN_IF_ERROR(Exec(n.else_body, inner, out, flow));
    }
    return Status::Ok();
  }

  // A macro (closure == nullptr: its frame's parent is the template's top level) or a call
  // block's caller (closure: the frame of the call block).
  Value MakeMacro(const Node& n, const Frame* closure) {
    auto c = std::make_shared<Callable>();
    c->name = n.name.empty() ? "caller" : n.name;
    const Frame* parent = closure != nullptr ? closure : root_;
    c->call = [this, &n, parent](const Args& args) -> Expected<Value> {
      // A template that recurses without end fails instead of exhausting the stack.
      if (depth_ >= kMaxCallDepth) {
        return InvalidArgument("macro calls nested deeper than " + std::to_string(kMaxCallDepth));
      }
      ++depth_;
      Expected<Value> result = CallMacro(n, parent, args);
      --depth_;
      return result;
    };
    return Value(std::move(c));
  }

  Expected<Value> CallMacro(const Node& n, const Frame* parent, const Args& args) {
    {
      Frame frame{{}, parent};
      frame.MarkUndefined(n.scope_undefined);
      if (args.positional.size() > n.params.size()) {
        return InvalidArgument("macro '" + n.name + "' takes " + std::to_string(n.params.size()) +
                               " arguments, got " + std::to_string(args.positional.size()));
      }
      for (const auto& [k, v] : args.keyword) {
        bool known = k == "caller";
        for (const auto& p : n.params) known = known || p == k;
        if (!known) {
          return InvalidArgument("macro '" + n.name + "' has no argument '" + k + "'");
        }
        if (k == "caller") frame.vars.Set(k, v);
      }
      for (size_t i = 0; i < n.params.size(); ++i) {
        if (const Value* v = args.Get(i, n.params[i])) {
          frame.vars.Set(n.params[i], *v);
        } else if (n.defaults[i]) {
          GZ_ASSIGN_OR_RETURN(Value d, Eval(*n.defaults[i], frame));
          frame.vars.Set(n.params[i], std::move(d));
        } else {
          frame.vars.Set(n.params[i], Value::MakeUndefined(n.params[i]));
        }
      }
      std::string out;
      Flow flow = Flow::kNormal;
      GZ_RETURN_IF_ERROR(Exec(n.body, frame, out, flow));
      return Value(std::move(out));
    }
  }

  Expected<Args> EvalArgs(const Expr& e, Frame& frame, size_t first) {
    Args args;
    for (size_t i = first; i < e.children.size(); ++i) {
      GZ_ASSIGN_OR_RETURN(Value v, Eval(*e.children[i], frame));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [k, expr] : e.keyword) {
      GZ_ASSIGN_OR_RETURN(Value v, Eval(*expr, frame));
      args.keyword.emplace_back(k, std::move(v));
    }
    return args;
  }

  Expected<Value> EvalInner(const Expr& e, Frame& frame) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName: {
        if (const Value* v = frame.Find(e.name)) return *v;
        return Value::MakeUndefined(e.name);
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        List items;
        for (const auto& c : e.children) {
          GZ_ASSIGN_OR_RETURN(Value v, Eval(*c, frame));
          items.push_back(std::move(v));
        }
        if (e.kind == Expr::Kind::kTuple) return Value::MakeTuple(std::move(items));
        return Value::MakeList(std::move(items));
      }
      case Expr::Kind::kDict: {
        Value d = Value::MakeDict();
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          GZ_ASSIGN_OR_RETURN(Value k, Eval(*e.children[i], frame));
          GZ_ASSIGN_OR_RETURN(Value v, Eval(*e.children[i + 1], frame));
          if (!k.IsString()) return Unimplemented("dict keys other than strings are not supported");
          d.AsDict().Set(k.AsString(), std::move(v));
        }
        return d;
      }
      case Expr::Kind::kGetattr: {
        GZ_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], frame));
        return GetAttr(obj, e.name);
      }
      case Expr::Kind::kGetitem: {
        GZ_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], frame));
        GZ_ASSIGN_OR_RETURN(Value key, Eval(*e.children[1], frame));
        return GetItem(obj, key);
      }
      case Expr::Kind::kSlice: {
        GZ_ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0], frame));
        Value bounds[3];
        const Value* ptrs[3] = {nullptr, nullptr, nullptr};
        for (int k = 0; k < 3; ++k) {
          if (e.children[1 + k]) {
            GZ_ASSIGN_OR_RETURN(bounds[k], Eval(*e.children[1 + k], frame));
            ptrs[k] = &bounds[k];
          }
        }
        return GetSlice(obj, ptrs[0], ptrs[1], ptrs[2]);
      }
      case Expr::Kind::kCall: {
        GZ_ASSIGN_OR_RETURN(Value callee, Eval(*e.children[0], frame));
        GZ_ASSIGN_OR_RETURN(Args args, EvalArgs(e, frame, 1));
        if (callee.IsUndefined()) {
          return InvalidArgument("'" + callee.undefined_name() + "' is undefined");
        }
        if (!callee.IsCallable()) {
          return InvalidArgument("'" + callee.TypeName() + "' object is not callable");
        }
        return callee.AsCallable().call(args);
      }
      case Expr::Kind::kFilter: {
        GZ_ASSIGN_OR_RETURN(Value operand, Eval(*e.children[0], frame));
        GZ_ASSIGN_OR_RETURN(Args args, EvalArgs(e, frame, 1));
        return ApplyFilter(e.name, operand, args);
      }
      case Expr::Kind::kTest: {
        GZ_ASSIGN_OR_RETURN(Value operand, Eval(*e.children[0], frame));
        GZ_ASSIGN_OR_RETURN(Args args, EvalArgs(e, frame, 1));
        GZ_ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, operand, args));
        return Value(r != e.negated);
      }
      case Expr::Kind::kUnary: {
        GZ_ASSIGN_OR_RETURN(Value v, Eval(*e.children[0], frame));
        if (e.name == "not") return Value(!v.Truthy());
        if (v.IsFloat()) return Value(e.name == "-" ? -v.AsDouble() : v.AsDouble());
        if (v.IsInt() || v.IsBool()) return Value(e.name == "-" ? -v.AsInt() : v.AsInt());
        return InvalidArgument("bad operand type for unary " + e.name + ": '" + v.TypeName() + "'");
      }
      case Expr::Kind::kBinary: {
        GZ_ASSIGN_OR_RETURN(Value a, Eval(*e.children[0], frame));
        if (e.name == "and") {
          if (!a.Truthy()) return a;
          return Eval(*e.children[1], frame);
        }
        if (e.name == "or") {
          if (a.Truthy()) return a;
          return Eval(*e.children[1], frame);
        }
        GZ_ASSIGN_OR_RETURN(Value b, Eval(*e.children[1], frame));
        return BinaryOp(e.name, a, b);
      }
      case Expr::Kind::kCompare: {
        GZ_ASSIGN_OR_RETURN(Value left, Eval(*e.children[0], frame));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          GZ_ASSIGN_OR_RETURN(Value right, Eval(*e.children[i + 1], frame));
          GZ_ASSIGN_OR_RETURN(Value r, BinaryOp(e.ops[i], left, right));
          if (!r.Truthy()) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::kCond: {
        GZ_ASSIGN_OR_RETURN(Value c, Eval(*e.children[1], frame));
        if (c.Truthy()) return Eval(*e.children[0], frame);
        if (e.children[2]) return Eval(*e.children[2], frame);
        return Value::MakeUndefined("");
      }
    }
    return Internal("unknown expression");
  }

  static constexpr int kMaxCallDepth = 100;
  const Frame* root_;
  const RenderLimits& limits_;
  int64_t steps_ = 0;
  int64_t bytes_ = 0;
  std::vector<DictPtr> namespaces_;  // namespaces assigned an attribute (repeats possible)
  int depth_ = 0;
};

}  // namespace

Expected<Template> Template::Parse(std::string_view source) {
  GZ_ASSIGN_OR_RETURN(Body body, ParseTemplate(source));
  Template t;
  t.root_undefined_ = AnalyzeScopes(body);
  t.body_ = std::make_shared<const Body>(std::move(body));
  return t;
}

Expected<std::string> Template::Render(const Dict& variables, const RenderLimits& limits) const {
  // The template's own names live in `root`, above the variables it was given, as Jinja keeps
  // its locals apart from the context.
  Frame globals{MakeGlobals(), nullptr};
  Frame context{variables, &globals};
  Frame root{{}, &context};
  root.MarkUndefined(root_undefined_);
  Renderer renderer(&root, limits);
  std::string out;
  Flow flow = Flow::kNormal;
  GZ_RETURN_IF_ERROR(renderer.Exec(*body_, root, out, flow));
  return out;
}

}  // namespace gizllm::jinja
