// The pipeline cache on disk: written when a context ends, with a header for this device;
// read back by the next context; a foreign or damaged file is ignored, never trusted.
#include <vulkan/vulkan.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "test_util.hpp"

namespace flashvk::test {
namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Runs one attention call on a fresh context that uses `path` as its pipeline cache.
std::vector<float> run_with_cache(const std::string& path) {
  ContextOptions options = test_options();
  options.pipeline_cache_path = path;
  Context ctx = Context::create(options);
  HostTensor q = random_tensor({1, 2, 20, 16}, 5), k = random_tensor({1, 2, 30, 16}, 6);
  std::vector<float> out = attention(ctx, q, k, k, {}).out.data;
  for (const std::string& m : ctx.take_validation_messages()) ADD_FAILURE() << m;
  return out;
}

class PipelineCacheTest : public VulkanTest {
 protected:
  std::string path = (std::filesystem::temp_directory_path() /
                      ("flashvk_cache_test_" +
                       std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + ".bin"))
                         .string();
  void TearDown() override {
    std::remove(path.c_str());
    VulkanTest::TearDown();
  }
};

TEST_F(PipelineCacheTest, IsWrittenWithThisDevicesHeaderAndReadBack) {
  std::remove(path.c_str());
  std::vector<float> first = run_with_cache(path);
  std::vector<char> data = read_file(path);
  VkPipelineCacheHeaderVersionOne header{};
  ASSERT_GE(data.size(), sizeof(header));
  std::memcpy(&header, data.data(), sizeof(header));
  EXPECT_EQ(header.headerVersion, VK_PIPELINE_CACHE_HEADER_VERSION_ONE);
  EXPECT_GE(header.headerSize, sizeof(header));
  std::vector<float> second = run_with_cache(path);  // starts from the saved cache
  EXPECT_EQ(first, second);
}

TEST_F(PipelineCacheTest, ForeignOrDamagedFilesAreIgnored) {
  std::vector<float> clean = run_with_cache("");
  {
    std::ofstream f(path, std::ios::binary);
    f << "not a pipeline cache, but long enough to look like a header........";
  }
  EXPECT_EQ(run_with_cache(path), clean);
  std::vector<char> data = read_file(path);  // replaced by a valid cache when the context ended
  VkPipelineCacheHeaderVersionOne header{};
  ASSERT_GE(data.size(), sizeof(header));
  std::memcpy(&header, data.data(), sizeof(header));
  EXPECT_EQ(header.headerVersion, VK_PIPELINE_CACHE_HEADER_VERSION_ONE);
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    header.deviceID ^= 0x5a5a;  // someone else's device, otherwise well formed
    f.write(reinterpret_cast<const char*>(&header), sizeof(header));
  }
  EXPECT_EQ(run_with_cache(path), clean);
}

}  // namespace
}  // namespace flashvk::test
