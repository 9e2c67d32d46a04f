// Jinja decides at compile time which names a scope owns (jinja2/idtracking.py). A scope (the
// template's top level, a loop body, a macro, a call, set or filter block) that assigns a name
// before anything in it reads it, outside any if, and whose enclosing scopes never mention the
// name, starts with the name undefined: a macro or block called before the assignment does not
// see the value the template was given. Everywhere else a name starts as the value seen from
// outside, which the renderer's frame chain gives. This pass finds the names that start
// undefined.
#include "template/jinja_scopes.h"

#include <map>
#include <set>

namespace gizllm::jinja {

namespace {

enum class First { kLoad, kStore, kBranch };

class ScopeAnalysis {
 public:
  // Analyzes one scope: its own level first (every name it mentions, and how it first does),
  // then the scopes nested in it, which see this scope's names as outer ones.
  static std::vector<std::string> Run(Body& body, const std::vector<std::string>& params,
                                      const std::set<std::string>& outer) {
    ScopeAnalysis a;
    for (const std::string& p : params) a.first_[p] = First::kBranch;
    a.VisitBody(body, /*in_branch=*/false);
    std::vector<std::string> undefined;
    std::set<std::string> refs = outer;
    for (const auto& [name, first] : a.first_) {
      refs.insert(name);
      if (first == First::kStore && !outer.count(name)) undefined.push_back(name);
    }
    for (const Nested& n : a.nested_) *n.result = Run(*n.body, n.params, refs);
    return undefined;
  }

 private:
  struct Nested {
    Body* body;
    std::vector<std::string> params;
    std::vector<std::string>* result;
  };

  void Load(const std::string& name, bool in_branch) {
    first_.emplace(name, in_branch ? First::kBranch : First::kLoad);
  }
  void Store(const std::string& name, bool in_branch) {
    first_.emplace(name, in_branch ? First::kBranch : First::kStore);
  }

  void VisitExpr(const Expr* e, bool in_branch) {
    if (e == nullptr) return;
    if (e->kind == Expr::Kind::kName) Load(e->name, in_branch);
    for (const ExprPtr& c : e->children) VisitExpr(c.get(), in_branch);
    for (const auto& [k, v] : e->keyword) VisitExpr(v.get(), in_branch);
  }

  void VisitBody(Body& body, bool in_branch) {
    for (NodePtr& n : body) VisitNode(*n, in_branch);
  }

  static std::vector<std::string> MacroParams(const Node& n) {
    std::vector<std::string> params = n.params;
    params.push_back("caller");
    return params;
  }

  void VisitNode(Node& n, bool in_branch) {
    switch (n.kind) {
      case Node::Kind::kText:
      case Node::Kind::kBreak:
      case Node::Kind::kContinue:
        return;
      case Node::Kind::kOutput:
        VisitExpr(n.expr.get(), in_branch);
        return;
      case Node::Kind::kIf:
        // The first condition runs on this level; the rest belongs to branches, and a name
        // first met inside a branch starts as its outer value.
        for (size_t i = 0; i < n.branches.size(); ++i) {
          VisitExpr(n.branches[i].first.get(), in_branch || i > 0);
          VisitBody(n.branches[i].second, /*in_branch=*/true);
        }
        return;
      case Node::Kind::kFor: {
        VisitExpr(n.expr.get(), in_branch);
        std::vector<std::string> params = n.targets;
        params.push_back("loop");
        nested_.push_back({&n.body, params, &n.scope_undefined});
        nested_.push_back({&n.else_body, {}, &n.else_undefined});
        return;
      }
      case Node::Kind::kSet:
        VisitExpr(n.expr.get(), in_branch);
        if (!n.attr.empty()) {
          Load(n.targets[0], in_branch);
        } else {
          for (const std::string& t : n.targets) Store(t, in_branch);
        }
        return;
      case Node::Kind::kSetBlock:
        Store(n.targets[0], in_branch);
        nested_.push_back({&n.body, {}, &n.scope_undefined});
        return;
      case Node::Kind::kMacro:
        Store(n.name, in_branch);
        nested_.push_back({&n.body, MacroParams(n), &n.scope_undefined});
        return;
      case Node::Kind::kCallBlock:
        VisitExpr(n.expr.get(), in_branch);
        nested_.push_back({&n.body, MacroParams(n), &n.scope_undefined});
        return;
      case Node::Kind::kFilterBlock:
        VisitExpr(n.expr.get(), in_branch);
        nested_.push_back({&n.body, {}, &n.scope_undefined});
        return;
      case Node::Kind::kScope:
        VisitBody(n.body, in_branch);
        return;
    }
  }

  std::map<std::string, First> first_;
  std::vector<Nested> nested_;
};

}  // namespace

std::vector<std::string> AnalyzeScopes(Body& root) { return ScopeAnalysis::Run(root, {}, {}); }

}  // namespace gizllm::jinja
