// The syntax tree of a parsed Jinja template: expressions and statements.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "template/jinja_value.h"

namespace gizllm::jinja {

// Where a construct starts in the template source, both 1-based.
struct Pos {
  int line = 1;
  int column = 1;
};

std::string FormatPos(const Pos& pos);  // "line 3, column 7"

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // children: items
    kTuple,    // children: items
    kDict,     // children: key, value, key, value ...
    kGetattr,  // children[0].name
    kGetitem,  // children[0][children[1]]
    kSlice,    // children[0][children[1]:children[2]:children[3]], each of the three may be null
    kCall,     // children[0](children[1..], keyword)
    kFilter,   // children[0] | name(children[1..], keyword)
    kTest,     // children[0] is [not] name(children[1..]); negated
    kUnary,    // name ("-", "+", "not") children[0]
    kBinary,   // children[0] name children[1]: + - * / // % ** ~ and or
    kCompare,  // children[0] ops[0] children[1] ops[1] children[2] ...: == != < <= > >= in notin
    kCond,     // children[0] if children[1] else children[2] (may be null)
  };
  Kind kind;
  Pos pos;
  Value literal;
  std::string name;
  std::vector<std::string> ops;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
  bool negated = false;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,       // text
    kOutput,     // {{ expr }}
    kIf,         // branches: (condition, body); the else branch has a null condition
    kFor,        // for targets in expr [if condition]: body [else: else_body]
    kSet,        // set targets = expr, or set targets[0].attr = expr
    kSetBlock,   // set targets[0] %} body {% endset
    kMacro,      // macro name(params = defaults) body
    kCallBlock,  // call[(params)] expr %} body {% endcall
    kBreak,
    kContinue,
    kScope,        // body rendered in place (generation blocks)
    kFilterBlock,  // filter expr.name(expr.children[1..]) %} body {% endfilter
  };
  Kind kind;
  Pos pos;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::string> targets;
  std::string attr;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param, null where it has none
  Body body;
  Body else_body;
  // Names the scope of body (else_body) assigns before reading: undefined until assigned, even
  // where an outer scope has them (filled by AnalyzeScopes).
  std::vector<std::string> scope_undefined;
  std::vector<std::string> else_undefined;
};

}  // namespace gizllm::jinja
