// Zero-copy output end to end, on every file system the machine lets us
// mount: loop-mounted XFS (reflink=1) and btrfs images, a tmpfs, and the
// default scratch file system. On each: convert with --copy auto, copy and
// reflink; outputs byte-identical whatever the method; verify exact; on
// reflink file systems the unchanged bytes shared and DST's real disk use a
// fraction of SRC's. Skipped, with the reason, where mounting is not allowed
// or mkfs is missing.
#include "common/error.hpp"
#include "convert/convert.hpp"
#include "e2e_support.hpp"
#include "verify/verify.hpp"

#include <sys/statvfs.h>
#include <unistd.h>

namespace mx2nv::e2e {
namespace {

enum class Fs { Default, Tmpfs, Xfs, Btrfs };

std::string fs_name(Fs f) {
  switch (f) {
    case Fs::Default: return "default";
    case Fs::Tmpfs: return "tmpfs";
    case Fs::Xfs: return "xfs";
    case Fs::Btrfs: return "btrfs";
  }
  return "?";
}

bool sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

// A scratch file system of the given type, mounted under `dir`; `skip`
// says why not when it could not be made.
class ScratchFs {
 public:
  ScratchFs(Fs type, const fs::path& dir) : root_(dir / "mnt") {
    fs::create_directories(root_);
    if (type == Fs::Default) return;
    if (type == Fs::Tmpfs) {
      mounted_ = sh("mount -t tmpfs -o size=256m tmpfs '" + root_.string() + "'");
      if (!mounted_) skip_ = "cannot mount a tmpfs here (needs root)";
      return;
    }
    const std::string mkfs = type == Fs::Xfs ? "mkfs.xfs -q -m reflink=1" : "mkfs.btrfs -q";
    if (!sh(std::string("command -v ") + (type == Fs::Xfs ? "mkfs.xfs" : "mkfs.btrfs"))) {
      skip_ = "no " + std::string(type == Fs::Xfs ? "mkfs.xfs (xfsprogs)" : "mkfs.btrfs (btrfs-progs)");
      return;
    }
    const fs::path image = dir / "image";
    if (!sh("truncate -s 320M '" + image.string() + "'") || !sh(mkfs + " '" + image.string() + "'")) {
      skip_ = "cannot make a " + fs_name(type) + " image";
      return;
    }
    mounted_ = sh("mount -o loop '" + image.string() + "' '" + root_.string() + "'");
    if (!mounted_) skip_ = "cannot loop-mount a " + fs_name(type) + " image here (needs root and loop devices)";
  }
  ~ScratchFs() {
    if (mounted_) sh("umount '" + root_.string() + "'");
  }
  const std::string& skip() const { return skip_; }
  const fs::path& root() const { return root_; }
  std::uint64_t used_bytes() const {
    ::sync();
    struct statvfs st {};
    if (::statvfs(root_.c_str(), &st) != 0) return 0;
    return (st.f_blocks - st.f_bfree) * st.f_frsize;
  }

 private:
  fs::path root_;
  bool mounted_ = false;
  std::string skip_;
};

FixtureSpec block_sized() {
  // Scales of N*K/32 = 4096 bytes: every unchanged tensor can be aligned.
  FixtureSpec s;
  s.layers = 2;
  s.experts = 4;
  s.hidden = 512;
  s.intermediate = 256;
  s.shards = 3;
  return s;
}

class ZeroCopy : public ::testing::TestWithParam<Fs> {};

TEST_P(ZeroCopy, ConvertVerifyWithEveryCopyMode) {
  ScratchDir d;
  ScratchFs scratch(GetParam(), d.path());
  if (!scratch.skip().empty()) GTEST_SKIP() << scratch.skip();
  const fs::path root = scratch.root();
  write_fixture(root / "src", block_sized());
  const auto opts = [&](const std::string& dst, CopyMode mode) {
    ConvertOptions o;
    o.source = root / "src";
    o.target = root / dst;
    o.threads = 2;
    o.copy = mode;
    return o;
  };

  const std::uint64_t before = scratch.used_bytes();
  const Report a = convert_checkpoint(opts("auto", CopyMode::Auto));
  const std::uint64_t added = scratch.used_bytes() - before;
  ASSERT_EQ(a.result, Outcome::Ok);
  const Report c = convert_checkpoint(opts("copy", CopyMode::Copy));
  ASSERT_EQ(c.result, Outcome::Ok);
  EXPECT_EQ(c.shared_bytes, 0u);
  EXPECT_GT(c.active_groups, 0u);
  // Every output byte is accounted for, whatever the method.
  for (const Report* r : {&a, &c}) {
    EXPECT_EQ(*r->shared_bytes + *r->copied_bytes, c.copied_bytes);
    EXPECT_EQ(r->written_bytes, c.written_bytes);
  }
  EXPECT_TRUE(snapshot(root / "auto") == snapshot(root / "copy")) << "outputs differ between --copy auto and copy";

  bool can_share = true;
  try {
    CopyEngine::require_sharing(File::open_read(root / "src/model-00001-of-00003.safetensors"), root);
  } catch (const Error&) {
    can_share = false;
  }
  if (GetParam() == Fs::Xfs || GetParam() == Fs::Btrfs) {
    EXPECT_TRUE(can_share);
  }
  if (GetParam() == Fs::Tmpfs) {
    EXPECT_FALSE(can_share);
  }
  if (can_share) {
    const Report r = convert_checkpoint(opts("reflink", CopyMode::Reflink));
    ASSERT_EQ(r.result, Outcome::Ok);
    EXPECT_TRUE(snapshot(root / "reflink") == snapshot(root / "copy")) << "outputs differ between reflink and copy";
    // All unchanged bytes but partial blocks at tensor ends are shared...
    EXPECT_GT(*r.shared_bytes, *r.copied_bytes * 10);
    EXPECT_EQ(a.shared_bytes, r.shared_bytes);
    // ...and take no new space: DST adds its new and copied bytes (here
    // ~0.4 MB) plus the file system's own blocks (XFS allocates inodes in
    // 32 KiB chunks; btree blocks), far less than the ~2 MB it shares, which a
    // copy would add again.
    EXPECT_LT(added, *a.shared_bytes / 2) << "DST added " << added << " bytes on disk; written " << a.written_bytes
                                         << ", copied " << a.copied_bytes << ", shared " << a.shared_bytes;
  } else {
    EXPECT_EQ(a.shared_bytes, 0u);
    try {
      convert_checkpoint(opts("reflink", CopyMode::Reflink));
      ADD_FAILURE() << "--copy reflink succeeded where nothing can be shared";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Usage);
      EXPECT_NE(std::string(e.what()).find("--copy reflink"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(root / "reflink")) << "a refused --copy reflink left DST behind";
  }
  for (const char* dst : {"auto", "copy"}) {
    const Report v = verify_checkpoint({root / "src", root / dst, Window::Marlin, 2, std::nullopt});
    EXPECT_EQ(v.result, Outcome::Ok) << dst << ": " << (v.differences.empty() ? "" : v.differences[0]);
    EXPECT_EQ(v.active_groups, c.active_groups);
  }
}

TEST_P(ZeroCopy, CliReportsWhereTheBytesWent) {
  ScratchDir d;
  ScratchFs scratch(GetParam(), d.path());
  if (!scratch.skip().empty()) GTEST_SKIP() << scratch.skip();
  const fs::path root = scratch.root();
  write_fixture(root / "src", block_sized());
  const CliResult r = run_cli("convert " + (root / "src").string() + " " + (root / "dst").string() +
                              " --report " + (d / "r.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("shared with SRC"), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(read_file(d / "r.json"));
  EXPECT_EQ(j["copy"]["mode"], "auto");
  EXPECT_GT(j["copy"]["written_bytes"].get<std::uint64_t>(), 0u);
  const std::uint64_t unchanged = j["copy"]["shared_bytes"].get<std::uint64_t>() + j["copy"]["copied_bytes"].get<std::uint64_t>();
  EXPECT_GT(unchanged, j["target_tensor_bytes"].get<std::uint64_t>() / 2);
  EXPECT_EQ(run_cli("convert --copy never " + (root / "src").string() + " " + (root / "x").string()).exit_code, 2);
}

INSTANTIATE_TEST_SUITE_P(FileSystems, ZeroCopy, ::testing::Values(Fs::Default, Fs::Tmpfs, Fs::Xfs, Fs::Btrfs),
                         [](const ::testing::TestParamInfo<Fs>& p) { return fs_name(p.param); });

}  // namespace
}  // namespace mx2nv::e2e
