// The copy engine with each method forced: the same bytes land whatever the
// method, the tally accounts for every byte, fallbacks happen where a file
// system refuses, and --copy reflink refuses up front where sharing cannot
// work. Sharing itself is exercised on XFS/btrfs loop mounts in the e2e suite.
#include "common/error.hpp"
#include "sys/copy_engine.hpp"

#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/vfs.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace mx2nv {
namespace {

class Scratch {
 public:
  Scratch() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/mx2nv-copy-XXXXXX";
    path_ = ::mkdtemp(tmpl.data());
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  fs::path operator/(const std::string& p) const { return path_ / p; }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// The file system type of `path` (statfs), 0 where it cannot be told.
unsigned long fs_type(const fs::path& path) {
  struct statfs st {};
  return ::statfs(path.c_str(), &st) == 0 ? static_cast<unsigned long>(st.f_type) : 0;
}

// Where copy_file_range is the kernel's own read/write loop, a refused clone
// falls back to streaming, not to the kernel's copy (two of the file systems
// copy_engine.cpp names; a test that sees another expects only "not Clone").
bool splices(const fs::path& path) {
  const unsigned long t = fs_type(path);
  return t == EXT4_SUPER_MAGIC || t == TMPFS_MAGIC;
}

std::vector<std::byte> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xFF);
  return out;
}

std::vector<std::byte> read_all(const fs::path& p) {
  const File f = File::open_read(p);
  std::vector<std::byte> out(static_cast<std::size_t>(f.size()));
  f.read_at(0, out);
  return out;
}

struct Range {
  std::uint64_t src, dst, length;
};

// Ranges that exercise every piece: aligned whole blocks with partial head
// and tail, offsets that disagree modulo the block, a range inside one block,
// an empty one, a range reaching the source's end.
const std::vector<Range> kRanges = {
    {0, 0, 3 * 4096}, {4096 + 100, 8 * 4096 + 100, 5 * 4096 + 17}, {7, 20 * 4096 + 3000, 9000},
    {50, 30 * 4096 + 50, 100}, {10, 31 * 4096, 0}, {12 * 4096 + 5, 40 * 4096 + 5, 4 * 4096 - 5}};
constexpr std::size_t kSourceSize = 16 * 4096;

// Writes every range with `engine` into a fresh file and checks the bytes.
TransferTally copy_ranges(CopyEngine& engine, const Scratch& dir, const std::string& name,
                          const fs::path& out_dir = {}) {
  const fs::path src_path = dir / "src";
  const auto source_bytes = random_bytes(kSourceSize, 1);
  {
    const File f = File::create_new(src_path);
    f.write_at(0, source_bytes);
  }
  const File src = File::open_read(src_path);
  const fs::path out_path = out_dir.empty() ? dir / name : out_dir / name;
  std::vector<std::byte> expected(45 * 4096, std::byte{0});
  TransferTally tally;
  {
    File dst = File::create_new(out_path);
    dst.set_size(expected.size());
    std::vector<std::byte> buffer(4096 + 512);  // not a block multiple: chunking must not matter
    for (const Range& r : kRanges) {
      engine.transfer(src, r.src, dst, r.dst, r.length, buffer, tally);
      std::copy_n(source_bytes.begin() + static_cast<std::ptrdiff_t>(r.src), r.length,
                  expected.begin() + static_cast<std::ptrdiff_t>(r.dst));
    }
    dst.sync();
    dst.close();
  }
  std::uint64_t total = 0;
  for (const Range& r : kRanges) total += r.length;
  EXPECT_EQ(tally.shared + tally.copied, total);
  EXPECT_TRUE(read_all(out_path) == expected) << name;
  return tally;
}

TEST(CopyEngine, StreamCopiesEveryByteItself) {
  Scratch dir;
  CopyEngine engine(CopyMethod::Stream, false);
  const TransferTally t = copy_ranges(engine, dir, "out");
  EXPECT_EQ(t.shared, 0u);
  EXPECT_EQ(engine.method(), CopyMethod::Stream);
}

TEST(CopyEngine, KernelCopyGivesTheSameBytesOrFallsBackToStreaming) {
  Scratch dir;
  CopyEngine engine(CopyMethod::KernelCopy, false);
  const TransferTally t = copy_ranges(engine, dir, "out");
  EXPECT_EQ(t.shared, 0u);
  EXPECT_NE(engine.method(), CopyMethod::Clone);
}

TEST(CopyEngine, AutoSharesWhereTheFileSystemCanElseFallsBack) {
  Scratch dir;
  CopyEngine engine(CopyMode::Auto);
  const TransferTally t = copy_ranges(engine, dir, "out");
  if (engine.method() == CopyMethod::Clone) {
    // A reflink file system: the whole blocks of the agreeing ranges.
    EXPECT_GT(t.shared, 0u);
    EXPECT_EQ(t.shared % 4096, 0u);
  } else {
    EXPECT_EQ(t.shared, 0u);  // fell back after the first refusal, bytes still right
    if (splices(dir.path())) {
      EXPECT_EQ(engine.method(), CopyMethod::Stream);
    }
  }
}

// Across file systems a clone always fails (EXDEV): auto falls back for good
// and the bytes are still right; copy_file_range may or may not cross (kernel
// version), and falls back to streaming where it cannot.
TEST(CopyEngine, AutoFallsBackAcrossFileSystems) {
  Scratch dir;
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  const std::string name = "mx2nv-copy-test-auto-" + std::to_string(::getpid());
  CopyEngine engine(CopyMode::Auto);
  const TransferTally t = copy_ranges(engine, dir, name, "/dev/shm");
  fs::remove(fs::path("/dev/shm") / name);
  EXPECT_EQ(t.shared, 0u);
  EXPECT_NE(engine.method(), CopyMethod::Clone);
  if (splices("/dev/shm")) {
    EXPECT_EQ(engine.method(), CopyMethod::Stream);
  }
}

TEST(CopyEngine, KernelCopyAcrossFileSystemsCopiesOrFallsBackToStreaming) {
  Scratch dir;
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  const std::string name = "mx2nv-copy-test-kernel-" + std::to_string(::getpid());
  CopyEngine engine(CopyMethod::KernelCopy, false);
  copy_ranges(engine, dir, name, "/dev/shm");
  fs::remove(fs::path("/dev/shm") / name);
}

TEST(CopyEngine, ReflinkModeRefusesUpFrontWhereSharingIsImpossible) {
  Scratch dir;
  {
    const File f = File::create_new(dir / "src");
    f.write_at(0, random_bytes(3 * 4096, 2));
  }
  const File src = File::open_read(dir / "src");
  // /dev/shm is a tmpfs on Linux: no reflinks, whatever the scratch FS is.
  const fs::path shm = "/dev/shm";
  if (!fs::is_directory(shm)) GTEST_SKIP() << "no /dev/shm here";
  try {
    CopyEngine::require_sharing(src, shm);
    ADD_FAILURE() << "a tmpfs cannot share extents with " << dir.path();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Usage);
    EXPECT_NE(std::string(e.what()).find("--copy reflink"), std::string::npos) << e.what();
  }
}

// Told up front that sharing is impossible (a writer asks DST before its
// first transfer), auto moves on as a refused clone would; reflink mode,
// whose sharing was checked before any write, does not.
TEST(CopyEngine, SharingRefusedUpFrontFallsBackLikeARefusedClone) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  const fs::path out = fs::path("/dev/shm") / ("mx2nv-copy-test-refused-" + std::to_string(::getpid()));
  const File dst = File::create_new(out);
  CopyEngine automatic(CopyMode::Auto);
  automatic.sharing_refused(dst);
  if (splices("/dev/shm")) {
    EXPECT_EQ(automatic.method(), CopyMethod::Stream);
  } else {
    EXPECT_EQ(automatic.method(), CopyMethod::KernelCopy);
  }
  automatic.sharing_refused(dst);  // once moved on, told again: stays
  EXPECT_NE(automatic.method(), CopyMethod::Clone);
  CopyEngine reflink(CopyMode::Reflink);
  reflink.sharing_refused(dst);
  EXPECT_EQ(reflink.method(), CopyMethod::Clone);
  fs::remove(out);
}

TEST(CopyEngine, ForcedCloneFailsClearlyWhereItCannotShare) {
  Scratch dir;
  {
    const File f = File::create_new(dir / "src");
    f.write_at(0, random_bytes(3 * 4096, 3));
  }
  const File src = File::open_read(dir / "src");
  const fs::path out = fs::path("/dev/shm") / ("mx2nv-copy-test-" + std::to_string(::getpid()));
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm here";
  File dst = File::create_new(out);
  std::vector<std::byte> buffer(4096);
  TransferTally tally;
  CopyEngine engine(CopyMethod::Clone, true);
  try {
    engine.transfer(src, 0, dst, 0, 3 * 4096, buffer, tally);
    ADD_FAILURE() << "cloned across file systems";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Io);
    EXPECT_NE(std::string(e.what()).find("cannot share"), std::string::npos) << e.what();
  }
  dst.close();
  fs::remove(out);
}

TEST(CopyEngine, ModeNamesRoundTrip) {
  for (const CopyMode m : {CopyMode::Auto, CopyMode::Reflink, CopyMode::Copy}) {
    EXPECT_EQ(parse_choice<CopyMode>(choice_name(m)), m);
  }
  EXPECT_FALSE(parse_choice<CopyMode>("never").has_value());
}

}  // namespace
}  // namespace mx2nv
