// Where a request's pictures come from (server/media.h): base64 of data: URLs, local files only
// under the allowed folder (symlinks and ".." resolved), no network.
#include "server/media.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace gizllm::server {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> Bytes(std::string_view s) { return {s.begin(), s.end()}; }

TEST(Base64, DecodesTheStandardAlphabet) {
  EXPECT_EQ(DecodeBase64(""), Bytes(""));
  EXPECT_EQ(DecodeBase64("Zg=="), Bytes("f"));
  EXPECT_EQ(DecodeBase64("Zm8="), Bytes("fo"));
  EXPECT_EQ(DecodeBase64("Zm9v"), Bytes("foo"));
  EXPECT_EQ(DecodeBase64("Zm9vYg"), Bytes("foob"));  // padding left out
  EXPECT_EQ(DecodeBase64("+/8="), (std::vector<uint8_t>{0xfb, 0xff}));
  for (const char* bad : {"Z", "Zm9vY", "Zm 9v", "Zm9v\n", "Zg=", "Zh==", "Zm-_", "Zg==Zg=="}) {
    EXPECT_FALSE(DecodeBase64(bad)) << bad;
  }
}

class LocalFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) / ("media_test_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "allowed" / "sub");
    fs::create_directories(root_ / "outside");
    std::ofstream(root_ / "allowed" / "sub" / "a b.png") << "inside";
    std::ofstream(root_ / "outside" / "secret.png") << "secret";
    fs::create_symlink(root_ / "outside" / "secret.png", root_ / "allowed" / "link.png");
    fs::create_symlink(root_ / "outside", root_ / "allowed" / "dir_link");
    options_.allowed_path = (root_ / "allowed").string();
  }
  void TearDown() override { fs::remove_all(root_); }

  fs::path root_;
  MediaOptions options_;
};

TEST_F(LocalFilesTest, ReadsFilesUnderTheFolderOnly) {
  const std::string inside = (root_ / "allowed" / "sub" / "a b.png").string();
  EXPECT_EQ(ReadPictureUrl(inside, options_).value(), Bytes("inside"));
  EXPECT_EQ(ReadPictureUrl("sub/a b.png", options_).value(), Bytes("inside"));
  EXPECT_EQ(ReadPictureUrl("file://" + (root_ / "allowed" / "sub" / "a%20b.png").string(), options_)
                .value(),
            Bytes("inside"));
  EXPECT_EQ(ReadPictureUrl("sub/../sub/a b.png", options_).value(), Bytes("inside"));
  // Outside: by "..", by an absolute path, through a symlink to a file or to a folder.
  for (const std::string& url :
       {std::string("../outside/secret.png"), (root_ / "outside" / "secret.png").string(),
        std::string("link.png"), std::string("dir_link/secret.png"),
        "file://" + (root_ / "outside" / "secret.png").string(), std::string("missing.png")}) {
    auto bytes = ReadPictureUrl(url, options_);
    ASSERT_FALSE(bytes.ok()) << url;
    EXPECT_NE(bytes.status().message().find("not a file or folder under the allowed media path"),
              std::string::npos)
        << bytes.status().message();
  }
  // A folder of its own is the allowed one: its prefix alone is not enough.
  fs::create_directories(root_ / "allowed2");
  std::ofstream(root_ / "allowed2" / "x.png") << "x";
  EXPECT_FALSE(ReadPictureUrl((root_ / "allowed2" / "x.png").string(), options_).ok());
  auto folder = ReadPictureUrl("sub", options_);
  ASSERT_FALSE(folder.ok());
  EXPECT_NE(folder.status().message().find("is not a file"), std::string::npos);
  // Over the size limit.
  options_.max_file_bytes = 3;
  auto big = ReadPictureUrl("sub/a b.png", options_);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("over the limit of 3"), std::string::npos);
}

TEST_F(LocalFilesTest, NoFolderNoFilesAndNeverTheNetwork) {
  MediaOptions off;
  auto bytes = ReadPictureUrl((root_ / "allowed" / "sub" / "a b.png").string(), off);
  ASSERT_FALSE(bytes.ok());
  EXPECT_NE(bytes.status().message().find("--allowed-media-path"), std::string::npos);
  for (const char* url : {"http://example.com/a.png", "HTTPS://example.com/a.png",
                          "//example.com/a.png", "ftp://example.com/a.png"}) {
    auto net = ReadPictureUrl(url, options_);
    ASSERT_FALSE(net.ok()) << url;
    EXPECT_NE(net.status().message().find("fetches nothing from the network"), std::string::npos)
        << net.status().message();
  }
}

TEST(DataUrls, TakePicturesInBase64Only) {
  MediaOptions options;
  EXPECT_EQ(ReadPictureUrl("data:image/png;base64,Zm9v", options).value(), Bytes("foo"));
  EXPECT_EQ(ReadPictureUrl("DATA:Image/JPEG;BASE64,Zm9v", options).value(), Bytes("foo"));
  EXPECT_EQ(ReadPictureUrl("data:image/webp;base64,Zm9v", options).value(), Bytes("foo"));
  struct Bad {
    const char* url;
    const char* why;
  };
  for (const Bad& b :
       {Bad{"data:image/gif;base64,Zm9v", "of type 'image/gif'"},
        Bad{"data:,foo", "of type 'text/plain'"}, Bad{"data:image/png,foo", "base64"},
        Bad{"data:image/png;base64", "needs a ','"},
        Bad{"data:image/png;base64,Zm9v!", "not valid base64"},
        Bad{"data:image/png;base64,", "holds no data"}}) {
    auto bytes = ReadPictureUrl(b.url, options);
    ASSERT_FALSE(bytes.ok()) << b.url;
    EXPECT_NE(bytes.status().message().find(b.why), std::string::npos)
        << b.url << ": " << bytes.status().message();
  }
}

}  // namespace
}  // namespace gizllm::server
