// The embed and rerank tasks' routes: POST /v1/embeddings (OpenAI's shape), POST /v1/rerank
// (Jina's, Cohere's and vLLM's: query, documents, top_n; results with index and
// relevance_score) and POST /v1/score (vLLM's: text_1, text_2; data[].score). Each parses its
// body (an error names the field), runs the EncoderModel and writes the answer with `usage`.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/api_error.h"
#include "server/encoder_model.h"

namespace gizllm::server {

// The most texts, documents or pairs one request may hold.
inline constexpr size_t kMaxEncoderInputs = 2048;

// The answer's JSON, or the error to send.
struct EncoderAnswer {
  nlohmann::json body;
  std::optional<ApiError> error;
};

// input: a string, an array of strings, an array of token ids or an array of such arrays;
// encoding_format "float" (default) or "base64" (little-endian float32 bytes); dimensions only
// as the model's own; a text longer than the model's positions is an error unless
// truncate_prompt_tokens (-1: the model's positions, or k > 0) cuts it at its end. Token arrays
// are read as given (no special tokens added).
EncoderAnswer Embeddings(EncoderModel& model, const nlohmann::json& body);
// query and documents (strings or {"text": ...}); top_n (absent or 0: all); return_documents
// (default true). A pair longer than the model's positions is cut longest first.
EncoderAnswer Rerank(EncoderModel& model, const nlohmann::json& body);
// text_1 and text_2: strings or arrays of strings; one text_1 is paired with every text_2, else
// both arrays pair up element by element (equal lengths).
EncoderAnswer Score(EncoderModel& model, const nlohmann::json& body);

}  // namespace gizllm::server
