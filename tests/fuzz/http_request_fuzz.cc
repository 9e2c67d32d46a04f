// HTTP requests: the input's first byte picks how many bytes each read from the socket returns
// (1 to 255; 0: all at once) and the rest is what the client sends. Requests are read one after
// another from the same buffer, with the parser's limits and options of Session::Run in
// server/http_server.cc (whose coroutines clang 14 with libstdc++ 12 does not compile, so it is
// not linked here), through the synchronous http::read that runs async_read's algorithm.
//
// Beast's assertions are on, as in a build without NDEBUG, through the handler below; it lets one
// pass that is wrong in Boost 1.74 (Debian 12's).
#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "fuzz_input.h"
#include "server/http_server.h"

// BOOST_ENABLE_ASSERT_HANDLER (tests/fuzz/CMakeLists.txt) sends Beast's failed assertions here.
namespace boost {

void assertion_failed_msg(char const* expr, char const* msg, char const* function, char const* file,
                          long line) {
  // Boost 1.74's parse_chunk_header asserts that 5 bytes follow a chunk whose header it has
  // seen, but a last chunk read a byte at a time ("0\r\n", "\r", "\n") reaches it with 3 or 4;
  // the code after the assertion asks for more bytes, as it should. Beast fixed the assertion
  // in 2024 (boostorg/beast#2861). beast_last_chunk_bytewise.http (corpus/http_request.tar.gz)
  if (std::string_view(expr) == "n >= 5" &&
      std::string_view(function).find("parse_chunk_header") != std::string_view::npos) {
    return;
  }
  std::fprintf(stderr, "%s:%ld: %s: assertion failed: %s%s%s\n", file, line, function, expr,
               msg ? ": " : "", msg ? msg : "");
  std::abort();
}

void assertion_failed(char const* expr, char const* function, char const* file, long line) {
  assertion_failed_msg(expr, nullptr, function, file, line);
}

}  // namespace boost

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using boost::system::error_code;

// A client's bytes arriving `chunk` at a time, then the end of the stream.
class ByteStream {
 public:
  ByteStream(std::string_view bytes, size_t chunk) : bytes_(bytes), chunk_(chunk) {}

  template <class MutableBuffers>
  size_t read_some(const MutableBuffers& buffers, error_code& ec) {
    if (bytes_.empty()) {
      ec = net::error::eof;
      return 0;
    }
    ec = {};
    const size_t n =
        net::buffer_copy(buffers, net::buffer(bytes_.data(), std::min(chunk_, bytes_.size())));
    bytes_.remove_prefix(n);
    return n;
  }
  template <class MutableBuffers>
  size_t read_some(const MutableBuffers& buffers) {
    error_code ec;
    const size_t n = read_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }

 private:
  std::string_view bytes_;
  size_t chunk_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = data[0] == 0 ? size : data[0];
  ByteStream stream(std::string_view(reinterpret_cast<const char*>(data + 1), size - 1), chunk);
  beast::flat_buffer buffer;
  const gizllm::server::ServerOptions options;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(64 * 1024);
    parser.body_limit(static_cast<uint64_t>(options.max_body_bytes));
    error_code ec;
    http::read(stream, buffer, parser, ec);
    if (ec) break;
    // What Session::Handle reads of a request before its body's JSON.
    http::request<http::string_body> request = parser.release();
    const std::string_view target(request.target().data(), request.target().size());
    const std::string_view path = target.substr(0, target.find('?'));
    const std::string_view method(request.method_string().data(), request.method_string().size());
    auto auth = request.find(http::field::authorization);
    size_t seen = path.size() + method.size() + request.body().size();
    if (auth != request.end()) seen += auth->value().size();
    gizllm::fuzz::Use(seen);
    if (!request.keep_alive()) break;
  }
  return 0;
}
