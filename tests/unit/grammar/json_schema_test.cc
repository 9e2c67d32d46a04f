#include "grammar/json_schema.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "grammar/matcher.h"

namespace gizllm {
namespace {

std::shared_ptr<const Grammar> Compile(const std::string& schema) {
  Expected<std::string> gbnf = JsonSchemaToGbnf(schema);
  EXPECT_TRUE(gbnf.ok()) << gbnf.status().message();
  if (!gbnf.ok()) return nullptr;
  Expected<Grammar> g = ParseGbnf(*gbnf);
  EXPECT_TRUE(g.ok()) << g.status().message() << "\n" << *gbnf;
  if (!g.ok()) return nullptr;
  return std::make_shared<const Grammar>(std::move(*g));
}

bool Matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  if (g == nullptr) return false;
  Matcher m(g);
  return m.Accept(text) && m.Complete();
}

std::string Refusal(const std::string& schema) {
  Expected<std::string> gbnf = JsonSchemaToGbnf(schema);
  return gbnf.ok() ? "" : gbnf.status().message();
}

TEST(JsonSchemaTest, ObjectsRequiredAndOptionalInOrder) {
  auto g = Compile(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
    "c":{"type":"boolean"}},"required":["b"],"additionalProperties":false})");
  EXPECT_TRUE(Matches(g, R"({"b":"x"})"));
  EXPECT_TRUE(Matches(g, R"({"a":1,"b":"x","c":true})"));
  EXPECT_TRUE(Matches(g, R"({"a": -12, "b":"x"})"));
  EXPECT_TRUE(Matches(g, R"({"b":"x","c":false})"));
  EXPECT_FALSE(Matches(g, R"({"a":1})"));
  EXPECT_FALSE(Matches(g, R"({"b":"x",})"));
  EXPECT_FALSE(Matches(g, R"({,"b":"x"})"));
  EXPECT_FALSE(Matches(g, R"({"b":"x","d":1})"));
  EXPECT_FALSE(Matches(g, R"({"c":true,"b":"x"})"));  // the schema's order
}

TEST(JsonSchemaTest, AnyObjectAndMaps) {
  Expected<Grammar> any = ParseGbnf(JsonObjectGbnf());
  ASSERT_TRUE(any.ok()) << any.status().message();
  auto g = std::make_shared<const Grammar>(std::move(*any));
  EXPECT_TRUE(Matches(g, R"({"a":[1,{"b":null}], "c":"\u00e9\n"})"));
  EXPECT_FALSE(Matches(g, R"([1])"));
  EXPECT_FALSE(Matches(g, R"({"a":01})"));
  auto map = Compile(R"({"type":"object","additionalProperties":{"type":"integer"}})");
  EXPECT_TRUE(Matches(map, R"({"x":1,"y":2})"));
  EXPECT_FALSE(Matches(map, R"({"x":"1"})"));
}

TEST(JsonSchemaTest, EnumConstAndUnions) {
  auto g = Compile(R"({"anyOf":[{"enum":["a\"b",1,null]},{"const":{"k":[true]}}]})");
  EXPECT_TRUE(Matches(g, R"("a\"b")"));
  EXPECT_TRUE(Matches(g, R"(null)"));
  EXPECT_TRUE(Matches(g, R"({"k":[true]})"));
  EXPECT_FALSE(Matches(g, R"(2)"));
  auto t = Compile(R"({"type":["string","null"],"maxLength":2})");
  EXPECT_TRUE(Matches(t, R"("ab")"));
  EXPECT_TRUE(Matches(t, R"(null)"));
  EXPECT_FALSE(Matches(t, R"("abc")"));
  auto one = Compile(R"({"oneOf":[{"type":"object","properties":{"kind":{"const":"a"},
    "x":{"type":"integer"}},"required":["kind"]},{"type":"object","properties":{"kind":
    {"const":"b"}},"required":["kind"]}]})");
  EXPECT_TRUE(Matches(one, R"({"kind":"a","x":3})"));
  EXPECT_TRUE(Matches(one, R"({"kind":"b"})"));
  EXPECT_NE(Refusal(R"({"oneOf":[{"type":"integer"},{"type":"number"}]})")
                .find("#/oneOf: branches 0 and 1 may both match"),
            std::string::npos);
}

TEST(JsonSchemaTest, RefsAndRecursion) {
  auto g = Compile(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
    "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v","kids"],
    "additionalProperties":false}},"$ref":"#/$defs/node"})");
  EXPECT_TRUE(
      Matches(g, R"({"v":1,"kids":[{"v":2,"kids":[]},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(Matches(g, R"({"v":1,"kids":[{"v":2}]})"));
  EXPECT_EQ(Refusal(R"({"$ref":"#/$defs/missing"})"),
            "json schema #/$ref: no such place: #/$defs/missing");
}

TEST(JsonSchemaTest, ArraysWithBounds) {
  auto g = Compile(R"({"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3})");
  EXPECT_FALSE(Matches(g, "[1]"));
  EXPECT_TRUE(Matches(g, "[1,2]"));
  EXPECT_TRUE(Matches(g, "[1, 2, 3]"));
  EXPECT_FALSE(Matches(g, "[1,2,3,4]"));
  auto p = Compile(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"integer"}],
    "items":false,"minItems":1})");
  EXPECT_TRUE(Matches(p, R"(["a"])"));
  EXPECT_TRUE(Matches(p, R"(["a",1])"));
  EXPECT_FALSE(Matches(p, R"([])"));
  EXPECT_FALSE(Matches(p, R"(["a",1,2])"));
}

TEST(JsonSchemaTest, IntegerBoundsAreExact) {
  auto g = Compile(R"({"type":"integer","minimum":-15,"exclusiveMaximum":128})");
  for (int v = -40; v <= 300; ++v) {
    EXPECT_EQ(Matches(g, std::to_string(v)), v >= -15 && v < 128) << v;
  }
  EXPECT_FALSE(Matches(g, "-0"));
  EXPECT_FALSE(Matches(g, "007"));
  auto big = Compile(R"({"type":"integer","minimum":1000})");
  EXPECT_FALSE(Matches(big, "999"));
  EXPECT_TRUE(Matches(big, "1000"));
  EXPECT_TRUE(Matches(big, "123456789"));
  auto n = Compile(R"({"type":"number","minimum":1,"maximum":5})");
  EXPECT_TRUE(Matches(n, "1"));
  EXPECT_TRUE(Matches(n, "4.99"));
  EXPECT_TRUE(Matches(n, "5.0"));
  EXPECT_FALSE(Matches(n, "5.1"));
  EXPECT_FALSE(Matches(n, "0.5"));
}

TEST(JsonSchemaTest, FormatsAndPatterns) {
  auto d = Compile(R"({"type":"string","format":"date"})");
  EXPECT_TRUE(Matches(d, R"("2024-01-31")"));
  EXPECT_FALSE(Matches(d, R"("2024-02-30")"));
  EXPECT_FALSE(Matches(d, R"("2024-13-01")"));
  auto dt = Compile(R"({"type":"string","format":"date-time"})");
  EXPECT_TRUE(Matches(dt, R"("2024-01-31T23:59:59.5+02:00")"));
  auto u = Compile(R"({"type":"string","format":"uuid"})");
  EXPECT_TRUE(Matches(u, R"("123e4567-e89b-12d3-a456-426614174000")"));
  auto e = Compile(R"({"type":"string","format":"email"})");
  EXPECT_TRUE(Matches(e, R"("a.b@example.com")"));
  EXPECT_FALSE(Matches(e, R"("a@b")"));
  auto p = Compile(R"j({"type":"string","pattern":"^[A-Z]{2}-\\d{3}(x|yz)?$"})j");
  EXPECT_TRUE(Matches(p, R"("AB-123")"));
  EXPECT_TRUE(Matches(p, R"("AB-123yz")"));
  EXPECT_FALSE(Matches(p, R"("AB-12")"));
  auto q = Compile(R"({"type":"string","pattern":"a\"b"})");  // unanchored: anywhere
  EXPECT_TRUE(Matches(q, R"("xxa\"byy")"));
  EXPECT_FALSE(Matches(q, R"("xxab")"));
  EXPECT_NE(Refusal(R"j({"properties":{"p":{"type":"string","pattern":"(?=a)"}}})j")
                .find("json schema #/properties/p/pattern: pattern (?=a): a lookaround"),
            std::string::npos);
  EXPECT_NE(Refusal(R"j({"type":"string","pattern":"^ab(?=a)"})j")
                .find("pattern ^ab(?=a): a lookaround is not supported (at position 3)"),
            std::string::npos);
  EXPECT_NE(Refusal(R"j({"type":"string","pattern":"(a)\\1"})j").find("the escape \\1"),
            std::string::npos);
  EXPECT_NE(Refusal(R"j({"type":"string","pattern":"^a{2,4111111111}$"})j").find("the quantifier"),
            std::string::npos);
  EXPECT_NE(Refusal(R"j({"type":"string","pattern":"^a{3,2}$"})j").find("the quantifier"),
            std::string::npos);
}

TEST(JsonSchemaTest, AllOfMergesObjects) {
  auto g = Compile(R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},
    "required":["a"]},{"properties":{"b":{"type":"null"}},"required":["b"]}]})");
  EXPECT_TRUE(Matches(g, R"({"a":1,"b":null})"));
  EXPECT_FALSE(Matches(g, R"({"a":1})"));
  EXPECT_EQ(Refusal(R"({"allOf":[{"type":"string"},{"minLength":2}]})"),
            "json schema #/allOf/0/type: allOf merges object schemas only");
}

TEST(JsonSchemaTest, UnsupportedIsRefusedByPath) {
  EXPECT_EQ(Refusal(R"({"properties":{"a":{"patternProperties":{}}}})"),
            "json schema #/properties/a/patternProperties: unsupported keyword");
  EXPECT_EQ(Refusal(R"({"type":"array","uniqueItems":true})"),
            "json schema #/uniqueItems: unsupported keyword");
  EXPECT_EQ(Refusal(R"({"type":"string","format":"hostname"})"),
            "json schema #/format: unsupported format \"hostname\" (supported: date, time, "
            "date-time, uuid, email)");
  EXPECT_EQ(Refusal(R"({"type":"number","exclusiveMinimum":0})"),
            "json schema #/exclusiveMinimum: exclusive bounds on numbers are not supported "
            "(integers take them)");
  EXPECT_EQ(Refusal(R"({"$ref":"http://x/y"})"),
            "json schema #/$ref: only references into this document (#...) are supported");
  EXPECT_EQ(Refusal("{"), "json schema: not valid JSON");
  EXPECT_EQ(Refusal("false"), "json schema #: the schema false accepts nothing");
  EXPECT_EQ(Refusal(R"({"type":"integer","multipleOf":2})"),
            "json schema #/multipleOf: unsupported keyword");
}

}  // namespace
}  // namespace gizllm
