// JSON Schema to GBNF: the subset of draft 2020-12 that OpenAI's structured outputs use, compiled
// so that every text the grammar allows is a JSON document the schema accepts.
//
// Supported: type (a name or a list), properties, required, additionalProperties (false, or a
// schema where there are no properties), enum, const, anyOf, oneOf (branches that cannot both
// match: different types, or objects told apart by a const/enum property or by a required key the
// other refuses), allOf (of object schemas, merged), $ref and $defs/definitions (JSON pointers into
// the document, recursion included), items, prefixItems, minItems, maxItems, minLength, maxLength,
// format (date, time, date-time, uuid, email), pattern (grammar/regex.h: literals,
// classes, ., groups, |, ?, *, +, {m,n}, ^ and $ at the ends), minimum, maximum,
// exclusiveMinimum, exclusiveMaximum (exact for integers; for numbers, whole bounds from 0 up),
// and the annotations (title, description, default, examples, $comment, ...). Anything else is
// refused with its path: `#/properties/a/patternProperties: unsupported keyword`.
//
// What the grammar allows is a subset of what the schema accepts, chosen so that outputs stay
// short and exact:
//   - whitespace: none, except an optional single space after ':' and ','.
//   - properties in the schema's order; optional ones may be left out; no other properties where
//     the schema lists properties, even when it would allow more.
//   - integers of at most 16 digits (exact in a double); numbers of at most 16 digits before the
//     point and 15 after, exponents of at most 2 digits.
//   - email: at most 4 dot-separated atoms of 16 characters before the @, 4 labels of 16 after;
//     fractions of seconds in time: at most 6 digits.
//   - strings: \u escapes of surrogates are never written (a pair would count as one character
//     in minLength/maxLength).
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"
#include "grammar/grammar.h"

namespace gizllm {

// The GBNF of the documents `schema` (JSON text) accepts, rule `root` first.
Expected<std::string> JsonSchemaToGbnf(std::string_view schema);

// JsonSchemaToGbnf, parsed.
Expected<Grammar> JsonSchemaGrammar(std::string_view schema);

// The GBNF of any JSON object (response_format {"type": "json_object"}).
std::string JsonObjectGbnf();

}  // namespace gizllm
