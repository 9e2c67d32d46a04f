// The embed and rerank tasks' routes: POST /v1/embeddings (OpenAI's shape), POST /v1/rerank
// (Jina's, Cohere's and vLLM's: query, documents, top_n; results with index and
// relevance_score) and POST /v1/score (vLLM's: text_1, text_2; data[].score). Each is read in
// two halves around the model: Prepare* parses the body (an error names the field) and tokenizes
// it into an EncoderJob, whose sequences run on the EncoderModel (alone, or batched with other
// requests' by server/encoder_batcher.h), and whose `answer` writes the reply with `usage`.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

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

// What the model gives a job's sequences, one result each, in their order: vectors (the embed
// task) or scores (the rerank task).
struct EncoderResults {
  std::vector<std::vector<float>> vectors;
  std::vector<float> scores;
};

// A request read and tokenized, waiting for the model.
struct EncoderJob {
  std::vector<Encoding> sequences;  // texts to embed, or pairs to score (the model's task)
  // Writes the answer from the sequences' results.
  std::function<EncoderAnswer(EncoderResults)> answer;
};

// A job, or the error to answer at once.
struct PreparedEncoderRequest {
  EncoderJob job;
  std::optional<ApiError> error;
};

// input: a string, an array of strings, an array of token ids or an array of such arrays;
// encoding_format "float" (default) or "base64" (little-endian float32 bytes); dimensions: the
// model's own, or fewer where its config says it was trained for them (EncoderModel::
// CheckDimensions); prompt_name: a prompt of config_sentence_transformers.json put before every
// text (default: its default_prompt_name; token arrays get none); a text longer than the model's
// positions is an error unless truncate_prompt_tokens (-1: the model's positions, or k > 0)
// cuts it at its end. Token arrays are read as given (no special tokens added).
PreparedEncoderRequest PrepareEmbeddings(EncoderModel& model, const nlohmann::json& body);
// query and documents (strings or {"text": ...}); top_n (absent or 0: all); return_documents
// (default true). A pair longer than the model's positions is cut longest first.
PreparedEncoderRequest PrepareRerank(EncoderModel& model, const nlohmann::json& body);
// text_1 and text_2: strings or arrays of strings; one text_1 is paired with every text_2, else
// both arrays pair up element by element (equal lengths).
PreparedEncoderRequest PrepareScore(EncoderModel& model, const nlohmann::json& body);

// Runs sequences on the model in one call, as its task asks (Embed or Score).
Expected<EncoderResults> RunEncoder(EncoderModel& model, std::span<const Encoding> sequences);

}  // namespace gizllm::server
