#include "tokenizer/models.h"

namespace gizllm::tok {

Expected<std::unique_ptr<Model>> MakeUnigramModel(const Json& j, const std::string& where) {
  return Unimplemented("field '" + where + ".type': model type 'Unigram' is not supported");
}

}  // namespace gizllm::tok
