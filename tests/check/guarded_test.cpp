// guarded_test.cpp - guarded buffers read back in one batch (check/guarded.h): the downloads and every guard zone
// through Device::to_host_all on a device whose memory the host cannot read in place, as a GPU's.
#include "check/guarded.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "check/runner.h"

namespace attnfuzz {
namespace {

// Host memory without host_view: every read goes through to_host / to_host_all, as on a GPU. Counts the batches.
class CopyOnlyDevice final : public Device {
 public:
  CopyOnlyDevice() : Device(DeviceOptions{}) {}
  Backend backend() const override { return Backend::kCpu; }
  std::string name() const override { return "copy-only test device"; }
  void* alloc(size_t bytes) override { return std::calloc(bytes ? bytes : 1, 1); }
  void free(void* p) override { std::free(p); }
  void to_device(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void to_host(void* dst, const void* src, size_t n) override {
    ++copies;
    std::memcpy(dst, src, n);
  }
  void to_host_all(const std::vector<HostCopy>& c) override {
    ++batches;
    Device::to_host_all(c);
  }
  void synchronize() override {}
  LaunchResult launch(const af_kernel&, const af_problem&, const af_buffers&) override { return {}; }
  int batches = 0, copies = 0;
};

TEST(GuardedReadBack, DownloadsAndEveryGuardZoneInOneBatch) {
  CopyOnlyDevice dev;
  GuardedBuffer a(dev, "a", 10, 64, kGuardPoison), b(dev, "b", 4096, 64, kGuardPoison), c(dev, "c", 3, 16, kGuardPoison);
  std::vector<unsigned char> in(10), out(10, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<unsigned char>(i + 1);
  a.upload(in.data());
  const auto hits = GuardedBuffer::read_back(dev, {{&a, out.data()}}, {&a, &b, &c, nullptr});
  EXPECT_EQ(dev.batches, 1);
  EXPECT_EQ(dev.copies, 7);  // a's payload, then two guard zones of each buffer (b's after-guard is the page's end)
  EXPECT_TRUE(hits.empty());
  EXPECT_EQ(out, in);
  for (const GuardedBuffer* g : {&a, &b, &c}) EXPECT_EQ(g->changed_words(), 0u) << g->name();
}

TEST(GuardedReadBack, ChangedGuardWordsNamedPerBufferWithTheirOffsets) {
  CopyOnlyDevice dev;
  GuardedBuffer a(dev, "a", 10, 64, kGuardPoison), b(dev, "b", 16, 64, kGuardPoison);
  // a: the byte just past its 10-byte payload (a partial poison word) and a word 8 bytes before its start;
  // b: untouched.
  const unsigned char x = 0x11;
  dev.to_device(static_cast<char*>(a.data()) + 10, &x, 1);
  const uint32_t w = 0x12345678u;
  dev.to_device(static_cast<char*>(a.data()) - 8, &w, 4);
  const auto hits = GuardedBuffer::read_back(dev, {}, {&b, &a});
  ASSERT_EQ(hits.size(), 2u);
  EXPECT_EQ(hits[0].buffer, "a");
  EXPECT_EQ(hits[0].offset, -8);
  EXPECT_EQ(hits[0].got, w);
  EXPECT_EQ(hits[1].buffer, "a");
  EXPECT_EQ(hits[1].offset, 10);
  EXPECT_EQ(a.changed_words(), 2u);
  EXPECT_EQ(b.changed_words(), 0u);
  EXPECT_EQ(a.check().size(), 2u);  // the one-buffer check reads the same
  // At most max_hits reported per buffer, every changed word counted.
  for (int i = 0; i < 5; ++i) dev.to_device(static_cast<char*>(b.data()) + 16 + 4 * i, &w, 4);
  const auto few = GuardedBuffer::read_back(dev, {}, {&a, &b}, 1);
  ASSERT_EQ(few.size(), 2u);
  EXPECT_EQ(few[1].buffer, "b");
  EXPECT_EQ(b.changed_words(), 5u);
}

// The pool (check/runner.h) hands a kept allocation to a smaller payload that fits it with at most the need to
// spare: the spare bytes are after-guard, poisoned and checked as a fresh buffer's.
TEST(BufferPool, ASmallerPayloadReusesAFittingAllocationWithALongerAfterGuard) {
  CopyOnlyDevice dev;
  const size_t guard = 64 * 1024;
  BufferPool pool(dev);
  auto big = pool.take("o", 12288, guard, kGuardPoison);
  const size_t alloc = big->allocation();
  pool.give(std::move(big), guard, kGuardPoison);
  auto small = pool.take("o", 4095, guard, kGuardPoison);  // 8 KiB less payload: same guards, fits
  EXPECT_EQ(pool.hits(), 1);
  EXPECT_EQ(small->bytes(), 4095u);
  EXPECT_EQ(small->allocation(), alloc);
  EXPECT_TRUE(small->check().empty());  // the old payload's tail is after-guard now, poisoned
  const unsigned char x = 0;
  dev.to_device(static_cast<char*>(small->data()) + 4095 + 8000, &x, 1);  // where the old payload was
  const auto hits = small->check();
  ASSERT_EQ(hits.size(), 1u);
  EXPECT_EQ(hits[0].offset, 4095 + 8000 - 3);  // the word holding it (payload offsets of whole poison words)
  small.reset();  // a dirty buffer is never given back (launch_guarded keeps only clean ones)
  // A larger payload does not fit; an allocation more than twice the need is not taken either.
  auto larger = pool.take("o", 20000, guard, kGuardPoison);
  auto huge = pool.take("q", size_t{4} << 20, guard, kGuardPoison);
  pool.give(std::move(huge), guard, kGuardPoison);
  auto tiny = pool.take("q", 16, guard, kGuardPoison);
  EXPECT_EQ(pool.hits(), 1);
  EXPECT_EQ(pool.misses(), 4);
  EXPECT_EQ(tiny->allocation(), GuardedBuffer::allocation_bytes(16, guard));
}

}  // namespace
}  // namespace attnfuzz
