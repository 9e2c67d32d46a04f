#include "server/openai_request.h"

#include <gtest/gtest.h>

#include "core/json_nesting.h"
#include "grammar/matcher.h"

namespace gizllm::server {
namespace {

using nlohmann::json;

json Chat() { return {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}; }

TEST(ChatRequest, ReadsEveryField) {
  json body = Chat();
  body["messages"].push_back({{"role", "assistant"},
                              {"content", nullptr},
                              {"tool_calls",
                               {{{"id", "call_1"},
                                 {"type", "function"},
                                 {"function", {{"name", "f"}, {"arguments", "{\"x\": 1}"}}}}}}});
  body["messages"].push_back({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "2"}});
  body["messages"].push_back(
      {{"role", "developer"},
       {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}});
  body["tools"] = {
      {{"type", "function"}, {"function", {{"name", "f"}, {"parameters", json::object()}}}}};
  body["tool_choice"] = "auto";
  body["max_completion_tokens"] = 7;
  body["temperature"] = 0.5;
  body["top_p"] = 0.9;
  body["top_k"] = 40;
  body["min_p"] = 0.1;
  body["presence_penalty"] = 0.5;
  body["frequency_penalty"] = -0.5;
  body["repetition_penalty"] = 1.1;
  body["seed"] = 18446744073709551613ull;
  body["stop"] = {"x", "yy"};
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  body["reasoning_effort"] = "none";
  body["response_format"] = {{"type", "text"}};
  ChatRequest r;
  auto error = ParseChatRequest(body, 100, &r);
  ASSERT_FALSE(error) << error->message;
  EXPECT_EQ(*r.params.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.params.sampling.temperature, 0.5f);
  EXPECT_EQ(r.params.sampling.top_k, 40);
  EXPECT_EQ(*r.params.sampling.seed, 18446744073709551613ull);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"x", "yy"}));
  EXPECT_TRUE(r.params.stream && r.params.include_usage);
  EXPECT_EQ(r.params.sampling.logprobs, 3);
  EXPECT_EQ(r.input.enable_thinking, false);
  ASSERT_EQ(r.input.messages.size(), 4u);
  EXPECT_EQ(r.input.messages[1]["tool_calls"][0]["function"]["arguments"], json({{"x", 1}}));
  EXPECT_EQ(r.input.messages[3]["role"], "system");
  EXPECT_EQ(r.input.messages[3]["content"], "ab");
  EXPECT_EQ(r.input.tools.size(), 1u);
}

struct BadCase {
  const char* name;
  json patch;  // merged into a valid request
  const char* param;
};

TEST(ChatRequest, NamesTheFieldAtFault) {
  std::vector<BadCase> cases = {
      {"messages not array", {{"messages", "hi"}}, "messages"},
      {"messages empty", {{"messages", json::array()}}, "messages"},
      {"unknown role",
       {{"messages", {{{"role", "wizard"}, {"content", "x"}}}}},
       "messages[0].role"},
      {"content number",
       {{"messages", {{{"role", "user"}, {"content", 3}}}}},
       "messages[0].content"},
      {"image part without image_url",
       {{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}},
       "messages[0].content[0].image_url"},
      {"image_url without url",
       {{"messages",
         {{{"role", "user"},
           {"content", {{{"type", "image_url"}, {"image_url", {{"detail", "low"}}}}}}}}}},
       "messages[0].content[0].image_url.url"},
      {"image_url url a number",
       {{"messages",
         {{{"role", "user"},
           {"content", {{{"type", "image_url"}, {"image_url", {{"url", 5}}}}}}}}}},
       "messages[0].content[0].image_url.url"},
      {"image in a system message",
       {{"messages",
         {{{"role", "system"},
           {"content", {{{"type", "image_url"}, {"image_url", {{"url", "data:"}}}}}}}}}},
       "messages[0].content[0].type"},
      {"video_url with url and frames",
       {{"messages",
         {{{"role", "user"},
           {"content",
            {{{"type", "video_url"}, {"video_url", {{"url", "a"}, {"frames", {"b"}}}}}}}}}}},
       "messages[0].content[0].video_url"},
      {"video_url fps zero",
       {{"messages",
         {{{"role", "user"},
           {"content", {{{"type", "video_url"}, {"video_url", {{"url", "a"}, {"fps", 0}}}}}}}}}},
       "messages[0].content[0].video_url.fps"},
      {"video_url frames empty",
       {{"messages",
         {{{"role", "user"},
           {"content", {{{"type", "video_url"}, {"video_url", {{"frames", json::array()}}}}}}}}}},
       "messages[0].content[0].video_url.frames"},
      {"audio part",
       {{"messages", {{{"role", "user"}, {"content", {{{"type", "input_audio"}}}}}}}},
       "messages[0].content[0].type"},
      {"tool without id",
       {{"messages", {{{"role", "tool"}, {"content", "x"}}}}},
       "messages[0].tool_call_id"},
      {"max_tokens negative", {{"max_tokens", -1}}, "max_tokens"},
      {"max_tokens zero", {{"max_tokens", 0}}, "max_tokens"},
      {"max_tokens huge", {{"max_tokens", 1e30}}, "max_tokens"},
      {"max_tokens string", {{"max_tokens", "5"}}, "max_tokens"},
      {"max_tokens uint64", {{"max_tokens", 18446744073709551615ull}}, "max_tokens"},
      {"temperature high", {{"temperature", 3}}, "temperature"},
      {"temperature string", {{"temperature", "hot"}}, "temperature"},
      {"top_p zero", {{"top_p", 0}}, "top_p"},
      {"top_k fraction", {{"top_k", 1.5}}, "top_k"},
      {"stop too many", {{"stop", {"a", "b", "c", "d", "e"}}}, "stop"},
      {"stop number", {{"stop", 5}}, "stop"},
      {"n two", {{"n", 2}}, "n"},
      {"top_logprobs without logprobs", {{"top_logprobs", 2}}, "top_logprobs"},
      {"top_logprobs 21", {{"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs"},
      {"unknown key", {{"frobnicate", 1}}, "frobnicate"},
      {"tool_choice unknown", {{"tool_choice", "sometimes"}}, "tool_choice"},
      {"tool_choice without tools", {{"tool_choice", "required"}}, "tool_choice"},
      {"json_schema without its object",
       {{"response_format", {{"type", "json_schema"}}}},
       "response_format.json_schema"},
      {"response_format of another type",
       {{"response_format", {{"type", "yaml"}}}},
       "response_format.type"},
      {"strict schema with an unsupported keyword",
       {{"response_format",
         {{"type", "json_schema"},
          {"json_schema",
           {{"name", "x"},
            {"strict", true},
            {"schema",
             {{"type", "object"}, {"properties", {{"a", {{"not", {{"type", "string"}}}}}}}}}}}}}},
       "response_format.json_schema.schema"},
      {"grammar that does not parse", {{"grammar", "root ::= [a"}}, "grammar"},
      {"two grammars",
       {{"grammar", "root ::= \"a\""}, {"guided_json", {{"type", "string"}}}},
       "guided_json"},
      {"guided_regex with a lookaround", {{"guided_regex", "a(?=b)"}}, "guided_regex"},
      {"guided_regex not a string", {{"guided_regex", 5}}, "guided_regex"},
      {"guided_choice empty", {{"guided_choice", json::array()}}, "guided_choice"},
      {"guided_choice of a number", {{"guided_choice", {"a", 1}}}, "guided_choice[1]"},
      {"regex and json",
       {{"guided_regex", "a"}, {"guided_json", {{"type", "string"}}}},
       "guided_regex"},
      {"structured_outputs and grammar",
       {{"grammar", "root ::= \"a\""}, {"structured_outputs", {{"regex", "a"}}}},
       "structured_outputs"},
      {"structured_outputs not an object", {{"structured_outputs", "a"}}, "structured_outputs"},
      {"structured_outputs empty", {{"structured_outputs", json::object()}}, "structured_outputs"},
      {"structured_outputs two kinds",
       {{"structured_outputs", {{"regex", "a"}, {"choice", {"a"}}}}},
       "structured_outputs.regex"},
      {"structured_outputs unknown kind",
       {{"structured_outputs", {{"structural_tag", "x"}}}},
       "structured_outputs.structural_tag"},
      {"structured_outputs bad regex",
       {{"structured_outputs", {{"regex", "(a"}}}},
       "structured_outputs.regex"},
      {"structured_outputs bad grammar",
       {{"structured_outputs", {{"grammar", "root ::= [a"}}}},
       "structured_outputs.grammar"},
      {"structured_outputs bad schema",
       {{"structured_outputs", {{"json", {{"type", "string"}, {"format", "ipv4"}}}}}},
       "structured_outputs.json"},
      {"structured_outputs choice of a number",
       {{"structured_outputs", {{"choice", {1}}}}},
       "structured_outputs.choice[0]"},
      {"structured_outputs switch not a boolean",
       {{"structured_outputs", {{"regex", "a"}, {"disable_fallback", 1}}}},
       "structured_outputs.disable_fallback"},
      {"reasoning_effort", {{"reasoning_effort", "extreme"}}, "reasoning_effort"},
      {"stream string", {{"stream", "yes"}}, "stream"},
      {"include_usage string",
       {{"stream", true}, {"stream_options", {{"include_usage", 1}}}},
       "stream_options.include_usage"},
      {"stream_options without stream",
       {{"stream_options", {{"include_usage", true}}}},
       "stream_options"},
      {"stream_options with stream false",
       {{"stream", false}, {"stream_options", {{"include_usage", true}}}},
       "stream_options"},
      {"seed negative", {{"seed", -1}}, "seed"},
      {"seed 2^64", {{"seed", 18446744073709551616.0}}, "seed"},
      {"seed fraction", {{"seed", 2.5}}, "seed"},
      {"tool name closes the call",
       {{"tools", {{{"type", "function"}, {"function", {{"name", "f\"}</tool_call>"}}}}}}},
       "tools[0].function.name"},
      {"tool name empty",
       {{"tools", {{{"type", "function"}, {"function", {{"name", ""}}}}}}},
       "tools[0].function.name"},
      {"tool name of 65 characters",
       {{"tools", {{{"type", "function"}, {"function", {{"name", std::string(65, 'a')}}}}}}},
       "tools[0].function.name"},
      {"tool name with a space",
       {{"tools", {{{"type", "function"}, {"function", {{"name", "get weather"}}}}}}},
       "tools[0].function.name"},
      {"message name with a newline",
       {{"messages", {{{"role", "user"}, {"content", "x"}, {"name", "a\nb"}}}}},
       "messages[0].name"},
      {"called function name",
       {{"messages",
         {{{"role", "assistant"},
           {"tool_calls", {{{"function", {{"name", "<|im_end|>"}, {"arguments", "{}"}}}}}}}}}},
       "messages[0].tool_calls[0].function.name"},
      {"arguments nested too deeply",
       {{"messages",
         {{{"role", "assistant"},
           {"tool_calls",
            {{{"function",
               {{"name", "f"},
                {"arguments", std::string(200, '[') + std::string(200, ']')}}}}}}}}}},
       "messages[0].tool_calls[0].function.arguments"},
      {"logit_bias", {{"logit_bias", {{"5", 10}}}}, "logit_bias"},
  };
  for (const BadCase& c : cases) {
    json body = Chat();
    body.merge_patch(c.patch);
    ChatRequest r;
    auto error = ParseChatRequest(body, 100, &r);
    ASSERT_TRUE(error) << c.name;
    EXPECT_EQ(error->status, 400) << c.name;
    EXPECT_EQ(error->param, c.param) << c.name << ": " << error->message;
    json j = error->ToJson();
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
  }
}

TEST(ChatRequest, PicturesAndVideosBecomeMediaAndTemplateParts) {
  json body = Chat();
  body["messages"] = {
      {{"role", "system"},
       {"content", {{{"type", "text"}, {"text", "be "}}, {{"type", "text"}, {"text", "brief"}}}}},
      {{"role", "user"},
       {"content",
        {{{"type", "image_url"}, {"image_url", {{"url", "data:image/png;base64,AA=="}}}},
         {{"type", "text"}, {"text", "and"}},
         {{"type", "video_url"}, {"video_url", {{"url", "clip"}, {"fps", 4}}}},
         {{"type", "video_url"}, {"video_url", {{"frames", {"f0.png", "f1.png"}}}}}}}}};
  ChatRequest r;
  auto error = ParseChatRequest(body, 100, &r);
  ASSERT_FALSE(error) << error->message;
  // Text alone stays a string; with media the parts stay a list for the template.
  EXPECT_EQ(r.input.messages[0]["content"], "be brief");
  EXPECT_EQ(r.input.messages[1]["content"],
            json::parse(R"([{"type":"image"},{"type":"text","text":"and"},{"type":"video"},)"
                        R"({"type":"video"}])"));
  ASSERT_EQ(r.media.size(), 3u);
  EXPECT_EQ(r.media[0].kind, MediaKind::kPicture);
  EXPECT_EQ(r.media[0].param, "messages[1].content[0].image_url");
  EXPECT_EQ(r.media[0].url, "data:image/png;base64,AA==");
  EXPECT_EQ(r.media[1].kind, MediaKind::kVideo);
  EXPECT_EQ(r.media[1].param, "messages[1].content[2].video_url");
  EXPECT_EQ(r.media[1].url, "clip");
  EXPECT_EQ(r.media[1].fps, 4.0);
  EXPECT_EQ(r.media[2].frames, (std::vector<std::string>{"f0.png", "f1.png"}));
  EXPECT_FALSE(r.media[2].fps);
  // /tokenize takes no media.
  TokenizeRequest t;
  error = ParseTokenizeRequest(body, &t);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "messages[1].content[0].type");
}

TEST(ChatRequest, StructuredOutputFieldsCompileAGrammar) {
  const json schema = {{"type", "object"},
                       {"properties", {{"a", {{"type", "integer"}}}}},
                       {"required", {"a"}},
                       {"additionalProperties", false}};
  const std::vector<json> patches = {
      {{"response_format", {{"type", "json_object"}}}},
      {{"response_format",
        {{"type", "json_schema"},
         {"json_schema", {{"name", "a"}, {"strict", true}, {"schema", schema}}}}}},
      {{"guided_json", schema}},
      {{"json_schema", schema.dump()}},
      {{"grammar", "root ::= \"{\\\"a\\\":1}\""}},
      {{"guided_grammar", "root ::= \"{\\\"a\\\":1}\""}},
  };
  for (const json& patch : patches) {
    json body = Chat();
    body.merge_patch(patch);
    ChatRequest r;
    auto error = ParseChatRequest(body, 100, &r);
    ASSERT_FALSE(error) << patch.dump() << ": " << error->message;
    ASSERT_NE(r.params.sampling.grammar, nullptr) << patch.dump();
  }
  // The refusal names the place in the schema.
  json body = Chat();
  body["response_format"] = {
      {"type", "json_schema"},
      {"json_schema",
       {{"name", "a"},
        {"strict", true},
        {"schema", {{"properties", {{"p", {{"type", "string"}, {"format", "ipv4"}}}}}}}}}};
  ChatRequest r;
  auto error = ParseChatRequest(body, 100, &r);
  ASSERT_TRUE(error);
  EXPECT_NE(error->message.find("#/properties/p/format"), std::string::npos) << error->message;
  // Text is no constraint.
  body["response_format"] = {{"type", "text"}};
  ASSERT_FALSE(ParseChatRequest(body, 100, &r));
  EXPECT_EQ(r.params.sampling.grammar, nullptr);
}

TEST(ChatRequest, RegexChoiceAndStructuredOutputsCompileAGrammar) {
  auto grammar_of = [](const json& patch) -> std::shared_ptr<const Grammar> {
    json body = Chat();
    body.merge_patch(patch);
    ChatRequest r;
    auto error = ParseChatRequest(body, 100, &r);
    EXPECT_FALSE(error) << patch.dump() << ": " << error->message;
    EXPECT_NE(r.params.sampling.grammar, nullptr) << patch.dump();
    return r.params.sampling.grammar;
  };
  auto matches = [](const std::shared_ptr<const Grammar>& g, const std::string& text) {
    if (g == nullptr) return false;
    Matcher m(g);
    return m.Accept(text) && m.Complete();
  };
  const std::string phone = R"(\(\d{3}\) \d{3}-\d{4})";
  for (const json& patch :
       {json{{"guided_regex", phone}}, json{{"structured_outputs", {{"regex", phone}}}}}) {
    auto g = grammar_of(patch);
    EXPECT_TRUE(matches(g, "(555) 123-4567")) << patch.dump();
    EXPECT_FALSE(matches(g, "(555) 123-456")) << patch.dump();
    EXPECT_FALSE(matches(g, "call (555) 123-4567")) << patch.dump();  // a full match
  }
  for (const json& patch :
       {json{{"guided_choice", {"yes", "no", "say \"maybe\""}}},
        json{{"structured_outputs", {{"choice", {"yes", "no", "say \"maybe\""}}}}}}) {
    auto g = grammar_of(patch);
    EXPECT_TRUE(matches(g, "yes")) << patch.dump();
    EXPECT_TRUE(matches(g, "say \"maybe\"")) << patch.dump();
    EXPECT_FALSE(matches(g, "yesno")) << patch.dump();
    EXPECT_FALSE(matches(g, "ye")) << patch.dump();
  }
  const json schema = {{"type", "object"},
                       {"properties", {{"a", {{"type", "integer"}}}}},
                       {"required", {"a"}},
                       {"additionalProperties", false}};
  for (const json& patch :
       {json{{"structured_outputs", {{"json", schema}}}},
        json{{"structured_outputs", {{"json", schema.dump()}, {"disable_any_whitespace", true}}}},
        json{{"structured_outputs", {{"grammar", "root ::= \"{\\\"a\\\":1}\""}}}},
        json{{"structured_outputs", {{"json_object", true}}}}}) {
    auto g = grammar_of(patch);
    EXPECT_TRUE(matches(g, R"({"a":1})")) << patch.dump();
    EXPECT_FALSE(matches(g, R"({"a":1)")) << patch.dump();
  }
  // The refusal names the field and the place in the regex.
  json body = Chat();
  body["structured_outputs"] = {{"regex", "ab(?=c)"}};
  ChatRequest r;
  auto error = ParseChatRequest(body, 100, &r);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "structured_outputs.regex");
  EXPECT_EQ(error->message,
            "'structured_outputs.regex': regex: at position 2: a lookaround is not supported");
  // Completions take them too.
  CompletionRequest c;
  ASSERT_FALSE(ParseCompletionRequest({{"prompt", "x"}, {"guided_regex", "[0-9]+"}}, 100, &c));
  ASSERT_NE(c.params.sampling.grammar, nullptr);
  EXPECT_TRUE(matches(c.params.sampling.grammar, "42"));
  EXPECT_FALSE(matches(c.params.sampling.grammar, "4a"));
}

TEST(ChatRequest, NamedToolChoiceMustBeATool) {
  json body = Chat();
  body["tools"] = {{{"type", "function"}, {"function", {{"name", "f"}}}}};
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "g"}}}};
  ChatRequest r;
  ASSERT_TRUE(ParseChatRequest(body, 100, &r));
  body["tool_choice"]["function"]["name"] = "f";
  ChatRequest ok;
  ASSERT_FALSE(ParseChatRequest(body, 100, &ok));
  EXPECT_EQ(ok.tool_choice, "function");
  EXPECT_EQ(ok.forced_tool, "f");
}

// A forced call (a named function, or "required" over several tools) compiles the tools'
// parameters into the request's grammar: the call object after "<tool_call>\n", "name" first,
// then "\n</tool_call>". The grammar accepts the calls Qwen writes and refuses others; a
// response_format beside it is a 400, as is a parameters schema the compiler refuses.
TEST(ChatRequest, ForcedToolCallsHaveAGrammarOverTheirParameters) {
  json body = Chat();
  body["tools"] = {{{"type", "function"},
                    {"function",
                     {{"name", "get_weather"},
                      {"parameters",
                       {{"type", "object"},
                        {"properties", {{"city", {{"type", "string"}}}}},
                        {"required", {"city"}},
                        {"additionalProperties", false}}}}}},
                   {{"type", "function"}, {"function", {{"name", "now"}}}}};
  auto accepts = [](const Grammar& g, const std::string& text) {
    Matcher m(std::make_shared<const Grammar>(g));
    return m.Accept(std::string_view(text)) && m.Complete();
  };
  for (const char* choice : {"required", "get_weather"}) {
    SCOPED_TRACE(choice);
    body["tool_choice"] = std::string(choice) == "required"
                              ? json("required")
                              : json{{"type", "function"}, {"function", {{"name", choice}}}};
    ChatRequest r;
    auto error = ParseChatRequest(body, 100, &r);
    ASSERT_FALSE(error) << error->message;
    ASSERT_NE(r.params.sampling.grammar, nullptr);
    const Grammar& g = *r.params.sampling.grammar;
    EXPECT_TRUE(accepts(g,
                        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                        "</tool_call>"));
    EXPECT_FALSE(accepts(g,
                         "{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Paris\"}}\n"
                         "</tool_call>"));
    EXPECT_FALSE(accepts(g, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"));
    EXPECT_FALSE(accepts(g,
                         "{\"arguments\": {\"city\": \"Paris\"}, \"name\": \"get_weather\"}\n"
                         "</tool_call>"));
    // The other tool only where any tool may be called.
    EXPECT_EQ(accepts(g, "{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"),
              std::string(choice) == "required");
  }
  body["tool_choice"] = "required";
  body["response_format"] = {{"type", "json_object"}};
  ChatRequest both;
  auto error = ParseChatRequest(body, 100, &both);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "tool_choice");
  body.erase("response_format");
  body["tools"][0]["function"]["parameters"]["patternProperties"] = json::object();
  ChatRequest bad;
  error = ParseChatRequest(body, 100, &bad);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "tools");
  EXPECT_NE(error->message.find("patternProperties"), std::string::npos) << error->message;
}

// The forced call in the XML form (a model whose template writes <function=...>): only the
// tool's name, its listed parameters in the order of the request's tools (by name), each at most
// once and the required ones always; strings any text without "</parameter>", enums their words,
// other types JSON.
TEST(ChatRequest, ForcedXmlToolCallsHaveAGrammarOverTheirParameters) {
  json body = Chat();
  body["tools"] = {{{"type", "function"},
                    {"function",
                     {{"name", "get_weather"},
                      {"parameters",
                       {{"type", "object"},
                        {"properties",
                         {{"city", {{"type", "string"}}},
                          {"days", {{"type", "integer"}, {"minimum", 1}, {"maximum", 16}}},
                          {"unit", {{"enum", {"celsius", "fahrenheit"}}}},
                          {"detail",
                           {{"type", "object"},
                            {"properties", {{"hourly", {{"$ref", "#/$defs/flag"}}}}},
                            {"additionalProperties", false}}},
                          {"metric", {{"type", "boolean"}}}}},
                        {"$defs", {{"flag", {{"type", "boolean"}}}}},
                        {"required", {"city", "days"}}}}}}},
                   {{"type", "function"}, {"function", {{"name", "now"}}}}};
  auto accepts = [](const Grammar& g, const std::string& text) {
    Matcher m(std::make_shared<const Grammar>(g));
    return m.Accept(std::string_view(text)) && m.Complete();
  };
  auto param = [](const std::string& key, const std::string& value) {
    return "<parameter=" + key + ">\n" + value + "\n</parameter>\n";
  };
  auto call = [](const std::string& name, const std::string& params) {
    return "<function=" + name + ">\n" + params + "</function>\n</tool_call>";
  };
  const std::string city = param("city", "New York");
  const std::string days = param("days", "7");
  for (const char* choice : {"required", "get_weather"}) {
    SCOPED_TRACE(choice);
    body["tool_choice"] = std::string(choice) == "required"
                              ? json("required")
                              : json{{"type", "function"}, {"function", {{"name", choice}}}};
    ChatRequest r;
    auto error = ParseChatRequest(body, 100, &r, ToolCallSyntax::kXml);
    ASSERT_FALSE(error) << error->message;
    ASSERT_NE(r.params.sampling.grammar, nullptr);
    const Grammar& g = *r.params.sampling.grammar;
    // Valid calls: required only, every parameter, text with tags and newlines in it.
    EXPECT_TRUE(accepts(g, call("get_weather", city + days)));
    EXPECT_TRUE(
        accepts(g, call("get_weather", city + days + param("detail", "{\"hourly\": true}") +
                                           param("metric", "false") + param("unit", "celsius"))));
    EXPECT_TRUE(accepts(g, call("get_weather", param("city", "a <b> </param>\n</parameter\nc") +
                                                   days + param("metric", "true"))));
    EXPECT_TRUE(accepts(g, call("get_weather", param("city", "") + param("days", "16"))));
    // Wrong function or parameter names, missing required ones, duplicates, order.
    EXPECT_FALSE(accepts(g, call("get_weathers", city + days)));
    EXPECT_FALSE(accepts(g, call("get_weather", city + days + param("town", "Paris"))));
    EXPECT_FALSE(accepts(g, call("get_weather", param("town", "Paris") + days)));
    EXPECT_FALSE(accepts(g, call("get_weather", city)));
    EXPECT_FALSE(accepts(g, call("get_weather", days)));
    EXPECT_FALSE(accepts(g, call("get_weather", city + city + days)));
    EXPECT_FALSE(accepts(g, call("get_weather", city + days + days)));
    EXPECT_FALSE(accepts(g, call("get_weather", days + city)));
    // Values of the wrong type or out of the schema's bounds or words.
    EXPECT_FALSE(accepts(g, call("get_weather", city + param("days", "seven"))));
    EXPECT_FALSE(accepts(g, call("get_weather", city + param("days", "17"))));
    EXPECT_FALSE(accepts(g, call("get_weather", city + days + param("unit", "kelvin"))));
    EXPECT_FALSE(accepts(g, call("get_weather", city + days + param("metric", "True"))));
    EXPECT_FALSE(accepts(g, call("get_weather", city + days + param("detail", "{\"a\": 1}"))));
    // A string value ends at the first "</parameter>".
    EXPECT_FALSE(accepts(g, call("get_weather", param("city", "a</parameter>b") + days)));
    // The closing tags.
    EXPECT_FALSE(accepts(g, "<function=get_weather>\n" + city + days + "</function>"));
    EXPECT_FALSE(accepts(g, "<function=get_weather>\n" + city + days + "\n</tool_call>"));
    EXPECT_FALSE(accepts(g, "<function=get_weather>\n<parameter=city>\nParis</parameter>\n" + days +
                                "</function>\n</tool_call>"));
    // The tool without parameters: only where any tool may be called; any parameters of text.
    EXPECT_EQ(accepts(g, call("now", "")), std::string(choice) == "required");
    EXPECT_EQ(accepts(g, call("now", param("zone", "UTC+2"))), std::string(choice) == "required");
    // The JSON form is not this grammar.
    EXPECT_FALSE(accepts(g,
                         "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
                         "\"days\": 2}}\n</tool_call>"));
  }
  // A schema the compiler refuses is refused here too, naming its path.
  body["tool_choice"] = "required";
  body["tools"][0]["function"]["parameters"]["properties"]["days"]["multipleOf"] = 2;
  ChatRequest bad;
  auto error = ParseChatRequest(body, 100, &bad, ToolCallSyntax::kXml);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "tools");
  EXPECT_NE(error->message.find("multipleOf"), std::string::npos) << error->message;
}

// What the grammar allows the output parser reads back as the arguments it stands for.
TEST(ToolCallXmlGbnf, CallsItAllowsParseBackIntoTheirArguments) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters":
      {"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "number"},
       "list": {"type": "array", "items": {"type": "integer"}}, "any": {}},
       "required": ["s", "n", "list", "any"]}}}])");
  Expected<std::string> gbnf = ToolCallXmlGbnf(tools, "f");
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().message();
  Expected<Grammar> g = ParseGbnf(*gbnf);
  ASSERT_TRUE(g.ok()) << g.status().message() << "\n" << *gbnf;
  const std::string text =
      "<function=f>\n<parameter=any>\n[x]\n</parameter>\n<parameter=list>\n[1, 2]\n</parameter>\n"
      "<parameter=n>\n-1.5\n</parameter>\n<parameter=s>\n 12 \n</parameter>\n"
      "</function>\n</tool_call>";
  Matcher m(std::make_shared<const Grammar>(std::move(*g)));
  ASSERT_TRUE(m.Accept(std::string_view(text)));
  EXPECT_TRUE(m.Complete());
  OutputParserOptions options;
  options.tools = nlohmann::ordered_json::parse(tools.dump());
  OutputParser parser(options);
  std::vector<OutputEvent> events = parser.Feed("<tool_call>\n" + text);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, OutputEvent::Kind::kToolCall);
  EXPECT_EQ(events[0].arguments, R"({"any":"[x]","list":[1,2],"n":-1.5,"s":" 12 "})");
}

// parallel_tool_calls: one call, or one and more, each in its own tags.
TEST(ToolCallGbnf, ParallelAllowsFurtherCalls) {
  const json tools = json::parse(R"([
      {"type": "function", "function": {"name": "a", "parameters": {"type": "object",
       "properties": {"root": {"type": "integer"}}, "required": ["root"]}}},
      {"type": "function", "function": {"name": "b"}}])");
  const std::string one = R"({"name":"a","arguments":{"root":1}})"
                          "\n</tool_call>";
  const std::string two = one + "\n<tool_call>\n" + R"({"name":"b","arguments":{}})" +
                          "\n</tool_call>";
  auto accepts = [](const std::string& gbnf, const std::string& text) {
    Expected<Grammar> g = ParseGbnf(gbnf);
    EXPECT_TRUE(g.ok()) << g.status().message() << "\n" << gbnf;
    if (!g.ok()) return false;
    Matcher m(std::make_shared<const Grammar>(std::move(*g)));
    return m.Accept(std::string_view(text)) && m.Complete();
  };
  for (bool parallel : {false, true}) {
    Expected<std::string> gbnf = ToolCallGbnf(tools, "", parallel);
    ASSERT_TRUE(gbnf.ok()) << gbnf.status().message();
    EXPECT_TRUE(accepts(*gbnf, one)) << *gbnf;
    EXPECT_EQ(accepts(*gbnf, two), parallel) << *gbnf;
    EXPECT_FALSE(accepts(*gbnf, one + "\n<tool_call>\n"));  // a call left open
  }
  const json xml_tools = json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  const std::string xml_one = "<function=f>\n</function>\n</tool_call>";
  for (bool parallel : {false, true}) {
    Expected<std::string> gbnf = ToolCallXmlGbnf(xml_tools, "", parallel);
    ASSERT_TRUE(gbnf.ok()) << gbnf.status().message();
    EXPECT_TRUE(accepts(*gbnf, xml_one));
    EXPECT_EQ(accepts(*gbnf, xml_one + "\n<tool_call>\n" + xml_one), parallel) << *gbnf;
  }
}

// The request's parallel_tool_calls (default true, as OpenAI's) reaches the forced call's grammar.
TEST(ChatRequest, ParallelToolCallsShapesTheForcedCall) {
  json body = Chat();
  body["tools"] = {{{"type", "function"}, {"function", {{"name", "f"}}}}};
  body["tool_choice"] = "required";
  const std::string call = R"({"name":"f","arguments":{}})"
                           "\n</tool_call>";
  for (json flag : {json(nullptr), json(true), json(false)}) {
    json b = body;
    if (!flag.is_null()) b["parallel_tool_calls"] = flag;
    ChatRequest r;
    ASSERT_FALSE(ParseChatRequest(b, 100, &r));
    EXPECT_EQ(r.parallel_tool_calls, flag != false);
    ASSERT_NE(r.params.sampling.grammar, nullptr);
    Matcher m(r.params.sampling.grammar);
    const bool two = m.Accept(std::string_view(call + "\n<tool_call>\n" + call)) && m.Complete();
    EXPECT_EQ(two, flag != false) << flag.dump();
  }
  body["parallel_tool_calls"] = "yes";
  ChatRequest r;
  auto error = ParseChatRequest(body, 100, &r);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "parallel_tool_calls");
}

// Without strict, a schema the compiler refuses leaves the answer unconstrained and says so; a
// schema that compiles is followed either way; strict must be a boolean.
TEST(ChatRequest, SchemaWithoutStrictThatDoesNotCompileWarns) {
  const json refused = {{"type", "object"},
                        {"properties", {{"p", {{"type", "string"}, {"format", "ipv4"}}}}}};
  const json fine = {{"type", "object"}, {"properties", {{"p", {{"type", "string"}}}}}};
  for (json strict : {json(nullptr), json(false)}) {
    json body = Chat();
    body["response_format"] = {{"type", "json_schema"},
                               {"json_schema", {{"name", "a"}, {"schema", refused}}}};
    if (!strict.is_null()) body["response_format"]["json_schema"]["strict"] = strict;
    ChatRequest r;
    auto error = ParseChatRequest(body, 100, &r);
    ASSERT_FALSE(error) << error->message;
    EXPECT_EQ(r.params.sampling.grammar, nullptr);
    ASSERT_EQ(r.params.warnings.size(), 1u);
    EXPECT_NE(r.params.warnings[0].find("#/properties/p/format"), std::string::npos)
        << r.params.warnings[0];
    body["response_format"]["json_schema"]["schema"] = fine;
    ChatRequest ok;
    ASSERT_FALSE(ParseChatRequest(body, 100, &ok));
    EXPECT_NE(ok.params.sampling.grammar, nullptr);
    EXPECT_TRUE(ok.params.warnings.empty());
  }
  json body = Chat();
  body["response_format"] = {{"type", "json_schema"},
                             {"json_schema", {{"name", "a"}, {"strict", 1}, {"schema", fine}}}};
  ChatRequest r;
  auto error = ParseChatRequest(body, 100, &r);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "response_format.json_schema.strict");
  // Other fields stay strict: vLLM's guided_json refuses what does not compile.
  body = Chat();
  body["guided_json"] = refused;
  ASSERT_TRUE(ParseChatRequest(body, 100, &r));
}

TEST(PrefixGbnfRules, PrefixesNamesOnly) {
  EXPECT_EQ(PrefixGbnfRules("root ::= \"root\" [a-z] x{1,2} # y\nx ::= root", "p-"),
            "p-root ::= \"root\" [a-z] p-x{1,2} # y\np-x ::= p-root");
}

TEST(RenameGbnfRule, RenamesNamesOnly) {
  EXPECT_EQ(RenameGbnfRule("root ::= \"root\" [root] x-root root-x root # root\nx ::= root", "root",
                           "call"),
            "call ::= \"root\" [root] x-root root-x call # root\nx ::= call");
  EXPECT_EQ(RenameGbnfRule(R"(root ::= "a\"root" root)", "root", "r2"), R"(r2 ::= "a\"root" r2)");
}

TEST(ChatRequest, TakesEverySeedAndNameOpenAiTakes) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{18446744073709551615ull}}) {
    json body = Chat();
    body["seed"] = seed;
    ChatRequest r;
    ASSERT_FALSE(ParseChatRequest(body, 100, &r));
    EXPECT_EQ(*r.params.sampling.seed, seed);
  }
  json body = Chat();
  std::string longest(64, 'z');
  body["tools"] = {{{"type", "function"}, {"function", {{"name", "get_weather-2"}}}},
                   {{"type", "function"}, {"function", {{"name", longest}}}}};
  body["messages"][0]["name"] = "Ada_Lovelace";
  ChatRequest r;
  auto error = ParseChatRequest(body, 100, &r);
  EXPECT_FALSE(error) << error->message;
}

TEST(ChatRequest, BoundsMessagesAndTools) {
  json body = Chat();
  body["messages"] = json::array();
  for (size_t i = 0; i <= kMaxMessages; ++i) {
    body["messages"].push_back({{"role", "user"}, {"content", "x"}});
  }
  ChatRequest r;
  auto error = ParseChatRequest(body, 100, &r);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "messages");
  body["messages"].erase(body["messages"].size() - 1);
  EXPECT_FALSE(ParseChatRequest(body, 100, &r));

  body = Chat();
  body["tools"] = json::array();
  for (size_t i = 0; i <= kMaxTools; ++i) {
    body["tools"].push_back(
        {{"type", "function"}, {"function", {{"name", "f" + std::to_string(i)}}}});
  }
  ChatRequest t;
  error = ParseChatRequest(body, 100, &t);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "tools");
  body["tools"].erase(body["tools"].size() - 1);
  ChatRequest fits;
  EXPECT_FALSE(ParseChatRequest(body, 100, &fits));
}

TEST(RequestBody, NestingIsBoundedBeforeParsing) {
  json body;
  EXPECT_FALSE(ParseBody("{\"a\": " + std::string(kMaxJsonNesting - 1, '[') +
                             std::string(kMaxJsonNesting - 1, ']') + "}",
                         &body));
  // 500,000 levels: a parsed copy or dump() of it would overflow the stack.
  std::string deep = "{\"tools\": " + std::string(500000, '[') + std::string(500000, ']') + "}";
  auto error = ParseBody(deep, &body);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code, "nested_too_deeply");
  error = ParseBody("{\"a\": ", &body);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code, "invalid_json");
}

TEST(CompletionRequest, PromptForms) {
  CompletionRequest text;
  ASSERT_FALSE(ParseCompletionRequest({{"prompt", "abc"}}, 100, &text));
  EXPECT_EQ(text.prompt_text, "abc");
  EXPECT_EQ(*text.params.max_tokens, 16);
  CompletionRequest tokens;
  ASSERT_FALSE(ParseCompletionRequest({{"prompt", {1, 2, 3}}, {"logprobs", 2}}, 100, &tokens));
  EXPECT_EQ(tokens.prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(tokens.params.sampling.logprobs, 2);
  CompletionRequest batch;
  ASSERT_FALSE(ParseCompletionRequest({{"prompt", {"x"}}}, 100, &batch));
  EXPECT_EQ(batch.prompt_text, "x");
  CompletionRequest bad;
  EXPECT_EQ(ParseCompletionRequest({{"prompt", {1, 100}}}, 100, &bad)->param, "prompt");
  EXPECT_EQ(ParseCompletionRequest({{"prompt", ""}}, 100, &bad)->param, "prompt");
  EXPECT_EQ(ParseCompletionRequest(json::object(), 100, &bad)->param, "prompt");
  EXPECT_EQ(ParseCompletionRequest({{"prompt", "a"}, {"logprobs", 6}}, 100, &bad)->param,
            "logprobs");
  EXPECT_TRUE(ParseCompletionRequest(json::array(), 100, &bad));
}

TEST(DetokenizeRequest, ChecksIds) {
  DetokenizeRequest r;
  ASSERT_FALSE(ParseDetokenizeRequest({{"tokens", {0, 99}}}, 100, &r));
  EXPECT_EQ(ParseDetokenizeRequest({{"tokens", {-1}}}, 100, &r)->param, "tokens");
  EXPECT_EQ(ParseDetokenizeRequest({{"tokens", "x"}}, 100, &r)->param, "tokens");
}

}  // namespace
}  // namespace gizllm::server
