// A program outside the zinf tree: writes and reads back a file through the installed libzinf.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <zinf/aio/handle.h>
#include <zinf/aio/pinned.h>
#include <zinf/status.h>

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "zinf_consumer.bin";
  zinf::aio::AioConfig config;
  config.block_size = 65536;
  config.queue_depth = 4;
  auto handle = zinf::aio::Handle::create(config);
  if (!handle.is_ok()) {
    std::fprintf(stderr, "consumer: %s\n", handle.status().to_string().c_str());
    return 1;
  }
  const std::size_t n = 1 << 20;
  auto out = zinf::aio::PinnedBuffer::allocate(n);
  auto in = zinf::aio::PinnedBuffer::allocate(n);
  if (!out.is_ok() || !in.is_ok()) {
    std::fprintf(stderr, "consumer: pinned allocation failed\n");
    return 1;
  }
  for (std::size_t i = 0; i < n; ++i) out->bytes()[i] = static_cast<std::byte>(i * 31 + 7);
  zinf::Status s = (*handle)->sync_pwrite(out->data(), n, path, 0, {.truncate = true, .fdatasync = false});
  if (s.is_ok()) s = (*handle)->sync_pread(in->data(), n, path, 0);
  if (!s.is_ok()) {
    std::fprintf(stderr, "consumer: %s\n", s.to_string().c_str());
    return 1;
  }
  if (std::memcmp(out->data(), in->data(), n) != 0) {
    std::fprintf(stderr, "consumer: data read back differs\n");
    return 1;
  }
  std::printf("consumer: %zu bytes round-tripped through %s with backend %s\n", n, path.c_str(),
              std::string(zinf::aio::backend_name((*handle)->backend())).c_str());
  return 0;
}
