// Jinja's filters, tests, global functions and the Python methods templates call on strings,
// dicts and lists, with the semantics of jinja2 3.1 under transformers.
#pragma once

#include <optional>
#include <string>

#include "core/status.h"
#include "template/jinja_value.h"

namespace gizllm::jinja {

// Messages of the errors below name no position; the interpreter adds it.
Expected<Value> ApplyFilter(const std::string& name, const Value& operand, const Args& args);
Expected<bool> ApplyTest(const std::string& name, const Value& operand, const Args& args);

// Whether a filter or test of this name exists (the parser rejects others where it reads them).
bool IsFilter(const std::string& name);
bool IsTest(const std::string& name);

// obj.name as Jinja reads it: a method of a str, dict or list, else a dict item, else undefined.
Expected<Value> GetAttr(const Value& obj, const std::string& name);
// obj[key]: list and string indices (negative from the end), dict keys; else undefined.
Expected<Value> GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] of a list or string; null bounds are absent.
Expected<Value> GetSlice(const Value& obj, const Value* start, const Value* stop,
                         const Value* step);

// The items a for loop visits: list items, dict keys, string characters; undefined is empty.
Expected<List> Iterate(const Value& v);

// Arithmetic and comparison: + - * / // % ** ~ == != < <= > >= in notin.
Expected<Value> BinaryOp(const std::string& op, const Value& a, const Value& b);

// range, dict, namespace, raise_exception, strftime_now.
Dict MakeGlobals();

}  // namespace gizllm::jinja
