#include "formats/bitgpu_files.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/json_nesting.h"
#include "core/mapped_file.h"

namespace gizllm {

std::string BitgpuGgufDataFile(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return "";
  if (std::filesystem::file_size(path, ec) > (64u << 20) || ec) return "";
  auto text = ReadFile(path);
  if (!text.ok() || JsonTooDeep(*text)) return "";
  const nlohmann::json manifest = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!manifest.is_object()) return "";
  auto data = manifest.find("data_file");
  if (data == manifest.end() || !data->is_string()) return "";
  const std::string name = data->get<std::string>();
  if (!name.ends_with(".gguf") || name.find('/') != std::string::npos ||
      name.find('\\') != std::string::npos || name.find('\0') != std::string::npos) {
    return "";
  }
  return dir + "/" + name;
}

}  // namespace gizllm
