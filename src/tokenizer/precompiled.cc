#include "tokenizer/precompiled.h"

namespace gizllm::tok {

Expected<std::unique_ptr<Normalizer>> MakePrecompiledNormalizer(const Json& j,
                                                                const std::string& where) {
  return Unimplemented("field '" + where +
                       ".type': normalizer type 'Precompiled' is not supported");
}

}  // namespace gizllm::tok
