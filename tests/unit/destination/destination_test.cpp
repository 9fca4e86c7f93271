// The destination module on its own: states, atomic writes, abandon, lock,
// records, finish. (End-to-end behaviour through the CLI is in tests/e2e.)
#include "destination/destination.hpp"

#include "common/error.hpp"
#include "scratch.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <sys/ioctl.h>
#include <sys/vfs.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <atomic>
#include <fstream>
#include <set>
#include <thread>

namespace mx2nv {
namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

ErrorKind kind_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "no error";
  return ErrorKind::Io;
}

TEST(Destination, AnAbandonedRunThatFinishedNothingLeavesNothing) {
  Scratch s;
  {
    Destination d(s / "src", s / "dst", false);
    EXPECT_EQ(d.state(), DestinationState::Empty);
    EXPECT_FALSE(fs::exists(s / "dst"));  // checking writes nothing
    ASSERT_TRUE(d.open_for_writing({}));
    Destination::Pending p = d.begin("sub/dir/file.bin");
    p.file.write_at(0, std::as_bytes(std::span("abc", 3)));
  }
  EXPECT_FALSE(fs::exists(s / "dst"));
}

// The file system type of `path` (statfs), 0 where it cannot be told.
unsigned long fs_type(const fs::path& path) {
  struct statfs st {};
  return ::statfs(path.c_str(), &st) == 0 ? static_cast<unsigned long>(st.f_type) : 0;
}

std::set<std::string> tree(const fs::path& root) {
  std::set<std::string> names;
  for (const auto& e : fs::recursive_directory_iterator(root)) names.insert(e.path().string());
  return names;
}

// probe_sharing asks only a DST that exists, leaves nothing in it, and says
// what a clone the test makes itself says (FICLONE between two scratch
// files); across file systems it is No. may_share writes nothing and says
// yes only for SRC's own XFS or btrfs.
TEST(Destination, SharingIsProbedOnlyInsideAnExistingDst) {
  Scratch s;
  {
    File f = File::create_new(s / "src" / "shard");
    std::vector<std::byte> bytes(8192, std::byte{7});
    f.write_at(0, bytes);
    f.sync();
    f.close();
  }
  const File source = File::open_read(s / "src" / "shard");
  const std::set<std::string> before = tree(s / "");
  const Destination absent(s / "src", s / "dst", false);
  EXPECT_EQ(absent.probe_sharing(source), CopyEngine::Sharing::Unknown);
  EXPECT_EQ(tree(s / ""), before);  // nothing made beside DST

  Destination d(s / "src", s / "dst", false);
  ASSERT_TRUE(d.open_for_writing({}));
  const std::set<std::string> in_dst = tree(s / "dst");
  const CopyEngine::Sharing got = d.probe_sharing(source);
  EXPECT_EQ(tree(s / "dst"), in_dst);  // the probe's file has no name
  bool clones = false;
  {
    const File copy = File::create_new(s / "clone-oracle");
    clones = ::ioctl(copy.fd(), FICLONE, source.fd()) == 0;
  }
  EXPECT_EQ(got, clones ? CopyEngine::Sharing::Yes : CopyEngine::Sharing::No);

  const bool same_kind = fs_type(s / "src") == XFS_SUPER_MAGIC || fs_type(s / "src") == BTRFS_SUPER_MAGIC;
  EXPECT_EQ(d.may_share(source), same_kind);
  EXPECT_EQ(absent.may_share(source), same_kind);
  if (fs::is_directory("/dev/shm") && fs_type("/dev/shm") != fs_type(s / "src")) {
    const fs::path shm = fs::path("/dev/shm") / ("mx2nv-share-" + std::to_string(::getpid()));
    Destination there(s / "src", shm, false);
    EXPECT_FALSE(there.may_share(source));
    ASSERT_TRUE(there.open_for_writing({}));
    EXPECT_EQ(there.probe_sharing(source), CopyEngine::Sharing::No);  // EXDEV
    fs::remove_all(shm);
  }
}

TEST(Destination, CommittedFilesStayTemporariesGo) {
  Scratch s;
  {
    Destination d(s / "src", s / "dst", false);
    ASSERT_TRUE(d.open_for_writing({}));
    d.write_file("a.txt", "hello");
    Destination::Pending p = d.begin("b.txt");
  }
  EXPECT_EQ(slurp(s / "dst/a.txt"), "hello");
  for (const auto& e : fs::recursive_directory_iterator(s / "dst")) {
    EXPECT_FALSE(e.path().filename().string().starts_with(kTempPrefix)) << e.path();
  }
  // The state directory stays for --resume, with the (now stale) lock.
  EXPECT_TRUE(fs::exists(s / "dst/.mx2nv/lock"));
}

TEST(Destination, RelationToSourceAndEmptinessAreUsageErrors) {
  Scratch s;
  EXPECT_EQ(kind_of([&] { Destination(s / "src", s / "src", false); }), ErrorKind::Usage);
  EXPECT_EQ(kind_of([&] { Destination(s / "src", s / "src/inner", false); }), ErrorKind::Usage);
  EXPECT_EQ(kind_of([&] { Destination(s / "src/..", s / "x", false); }), ErrorKind::Usage);  // contains SRC
  std::ofstream(s / "file") << "x";
  EXPECT_EQ(kind_of([&] { Destination(s / "src", s / "file", false); }), ErrorKind::Usage);
  fs::create_directories(s / "full");
  std::ofstream(s / "full/x") << "x";
  EXPECT_EQ(kind_of([&] { Destination(s / "src", s / "full", false); }), ErrorKind::Usage);
  EXPECT_EQ(kind_of([&] { Destination(s / "src", s / "full", true); }), ErrorKind::Usage);  // no mx2nv state
}

TEST(Destination, ATreeWithSymlinksOrSpecialFilesIsRefused) {
  Scratch s;
  fs::create_directories(s / "a/.mx2nv/state");
  fs::create_symlink("/etc/passwd", s / "a/.mx2nv/state/x.json");
  EXPECT_EQ(kind_of([&] { Destination(s / "src", s / "a", true); }), ErrorKind::Usage);
  fs::create_directories(s / "b/.mx2nv");
  ASSERT_EQ(::mkfifo((s / "b/pipe").c_str(), 0644), 0);
  EXPECT_EQ(kind_of([&] { Destination(s / "src", s / "b", true); }), ErrorKind::Usage);
}

TEST(Destination, RecordsSurviveAnInterruptedRunAndFinishKeepsOnlyTheFinishedRecord) {
  Scratch s;
  ShardRecord r;
  r.shard = "shards/one.safetensors";
  r.source_size = 10;
  r.plan_hash = 7;
  r.output_size = 5;
  {
    Destination d(s / "src", s / "dst", false);
    ASSERT_TRUE(d.open_for_writing({}));
    d.write_file(r.shard, "bytes");
    d.write_record(r);
  }
  Destination again(s / "src", s / "dst", true);
  EXPECT_EQ(again.state(), DestinationState::Interrupted);
  const auto back = again.read_record(r.shard);
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(back->same_source(r));
  EXPECT_EQ(back->plan_hash, 7u);
  EXPECT_FALSE(again.read_record("another").has_value());

  ASSERT_TRUE(again.open_for_writing({r.shard, "config.json", "model.safetensors.index.json"}));
  FinishedRecord f;
  f.tool_version = "test";
  f.window = "marlin";
  f.shards = {r};
  f.index_hash = 1;
  again.write_file("config.json", "{}");
  again.finish(f, "model.safetensors.index.json", "{}");
  std::vector<std::string> state;
  for (const auto& e : fs::directory_iterator(s / "dst/.mx2nv")) state.push_back(e.path().filename().string());
  EXPECT_EQ(state, std::vector<std::string>{"finished.json"});

  Destination finished(s / "src", s / "dst", true);
  EXPECT_EQ(finished.state(), DestinationState::Finished);
  ASSERT_TRUE(finished.finished().has_value());
  EXPECT_EQ(finished.finished()->shards.at(0).shard, r.shard);
  EXPECT_EQ(finished.stamp(r.shard)->size, 5u);
  EXPECT_FALSE(finished.stamp("absent").has_value());
}

TEST(Destination, ForeignFilesRefuseAResume) {
  Scratch s;
  {
    Destination d(s / "src", s / "dst", false);
    ASSERT_TRUE(d.open_for_writing({}));
    d.write_file("mine.safetensors", "x");
  }
  std::ofstream(s / "dst/theirs.safetensors") << "y";
  Destination d(s / "src", s / "dst", true);
  EXPECT_EQ(kind_of([&] { static_cast<void>(d.open_for_writing({"mine.safetensors"})); }), ErrorKind::Usage);
  EXPECT_EQ(slurp(s / "dst/theirs.safetensors"), "y");
}

TEST(Destination, OneWriterAtATime) {
  Scratch s;
  Destination a(s / "src", s / "dst", false);
  ASSERT_TRUE(a.open_for_writing({}));
  Destination b(s / "src", s / "dst", true);
  EXPECT_EQ(kind_of([&] { static_cast<void>(b.open_for_writing({})); }), ErrorKind::Usage);
}

// A converter that lost a race to one that finished (the winner removes its
// lock file on finishing, so the loser creates a new one and gets it) is
// refused and must take the lock file it created with it: the finished
// destination's state directory holds the finished record alone.
TEST(Destination, ALoserOfARaceLeavesTheWinnersStateAsItWas) {
  Scratch s;
  {
    Destination late(s / "src", s / "dst", false);  // checked while DST was still empty
    fs::create_directories(s / "dst/.mx2nv");
    std::ofstream(s / "dst/.mx2nv/finished.json") << "{}";
    std::ofstream(s / "dst/model.safetensors.index.json") << "{}";
    EXPECT_EQ(kind_of([&] { static_cast<void>(late.open_for_writing({})); }), ErrorKind::Usage);
  }
  std::vector<std::string> state;
  for (const auto& e : fs::directory_iterator(s / "dst/.mx2nv")) state.push_back(e.path().filename().string());
  EXPECT_EQ(state, std::vector<std::string>{"finished.json"});
  EXPECT_TRUE(fs::exists(s / "dst/model.safetensors.index.json"));
}

TEST(Destination, RelativePathsThatEscapeAreRefused) {
  Scratch s;
  Destination d(s / "src", s / "dst", false);
  ASSERT_TRUE(d.open_for_writing({}));
  EXPECT_EQ(kind_of([&] { d.write_file("../escape.txt", "x"); }), ErrorKind::InvalidInput);
  EXPECT_EQ(kind_of([&] { d.write_file("a//b.txt", "x"); }), ErrorKind::InvalidInput);
  EXPECT_FALSE(fs::exists(s / "escape.txt"));
}

}  // namespace
}  // namespace mx2nv

namespace mx2nv {
namespace {

// A per-shard worker taking shard "b.safetensors" removes that shard's stale
// temporary files, and only those: not those of "a.b.safetensors", whose
// name ends the same way (its worker may be writing it right now).
TEST(Destination, TakingAShardRemovesOnlyItsOwnTemporaries) {
  Scratch s;
  fs::create_directories(s / "dst/.mx2nv");  // an interrupted run's state, as `mx2nv plan` leaves it
  for (const char* name : {".mx2nv-tmp.3.b.safetensors", ".mx2nv-tmp.7.a.b.safetensors", ".mx2nv-tmp.x.b.safetensors",
                           ".mx2nv-tmp..b.safetensors"}) {
    std::ofstream(s / "dst" / name) << "x";
  }
  Destination d(s / "src", s / "dst", true);
  ASSERT_TRUE(d.open_for_shards());
  {
    const Destination::ShardLock lock = d.lock_shard("b.safetensors");
  }
  EXPECT_FALSE(fs::exists(s / "dst/.mx2nv-tmp.3.b.safetensors"));
  EXPECT_TRUE(fs::exists(s / "dst/.mx2nv-tmp.7.a.b.safetensors"));
  EXPECT_TRUE(fs::exists(s / "dst/.mx2nv-tmp.x.b.safetensors"));
  EXPECT_TRUE(fs::exists(s / "dst/.mx2nv-tmp..b.safetensors"));
}

}  // namespace
}  // namespace mx2nv

namespace mx2nv {
namespace {

// Per-shard workers open the same DST while others write into it: a file
// renamed or removed between the tree walk's listing and its check (another
// worker's temporary file) is no reason to refuse DST. Before the fix, such
// a file was taken for a special file: exit 2, now and then, for a worker
// started beside a busy one.
TEST(Destination, FilesVanishingDuringTheTreeCheckAreNotRefused) {
  Scratch s;
  fs::create_directories(s / "dst/.mx2nv/state/records");
  // Stopped (and joined) when the test ends, failed or not.
  std::jthread churn([&](const std::stop_token& stop) {
    for (std::uint64_t n = 0; !stop.stop_requested(); ++n) {
      const fs::path temp = s / ("dst/.mx2nv/state/records/.mx2nv-tmp." + std::to_string(n) + ".r.json");
      std::ofstream(temp) << "x";
      fs::rename(temp, s / "dst/.mx2nv/state/records/r.json");
      std::ofstream(s / ("dst/.mx2nv-tmp." + std::to_string(n) + ".shard")) << "x";
      fs::remove(s / ("dst/.mx2nv-tmp." + std::to_string(n) + ".shard"));
    }
  });
  for (int i = 0; i < 3000; ++i) {
    // A few entries, so each walk lists names the churn then removes.
    Destination d(s / "src", s / "dst", true);
    ASSERT_EQ(d.state(), DestinationState::Interrupted);
  }
}

}  // namespace
}  // namespace mx2nv

namespace mx2nv {
namespace {

// Hard links planted in DST (issue 20, second round). A regular file of DST
// with more than one name is refused like a symlink, whenever the tree is
// checked; and a lock file, the one file mx2nv writes in place, is used only
// after fstat shows one name, even when the link appears after the check
// (here: between construction and locking). The other name is SRC's file,
// which must keep its bytes.
TEST(Destination, HardLinksPlantedInDstNeverRedirectWrites) {
  Scratch s;
  fs::create_directories(s / "src");
  std::ofstream(s / "src/config.json") << "precious";
  for (const char* planted : {".mx2nv/lock", ".mx2nv/conversion.json", ".mx2nv/state/x.json", "model.safetensors",
                              ".mx2nv-tmp.0.config.json"}) {
    const fs::path dst = s / "dst" / std::to_string(std::hash<std::string>{}(planted));
    fs::create_directories(dst / ".mx2nv/state");
    fs::create_hard_link(s / "src/config.json", dst / planted);
    EXPECT_EQ(kind_of([&] { Destination(s / "src", dst, true); }), ErrorKind::Usage) << planted;
  }
  // Planted after the tree was checked: the lock is refused before its pid is written.
  const fs::path dst = s / "late";
  fs::create_directories(dst / ".mx2nv");
  std::ofstream(dst / ".mx2nv/conversion.json") << "{}";
  for (const bool shards : {false, true}) {
    fs::remove(dst / ".mx2nv/lock");
    Destination d(s / "src", dst, true);
    fs::create_hard_link(s / "src/config.json", dst / ".mx2nv/lock");
    EXPECT_EQ(kind_of([&] {
                static_cast<void>(shards ? d.open_for_shards() : d.open_for_writing({}));
              }),
              ErrorKind::Usage);
  }
  // A shard's lock, likewise.
  fs::remove(dst / ".mx2nv/lock");
  Destination d(s / "src", dst, true);
  ASSERT_TRUE(d.open_for_shards());
  fs::create_directories(dst / ".mx2nv/locks");
  for (const auto& name : {std::string("a.safetensors")}) {
    Destination::ShardLock first = d.lock_shard(name);  // creates the lock file
    first = Destination::ShardLock();
    for (const auto& e : fs::directory_iterator(dst / ".mx2nv/locks")) {
      fs::remove(e.path());
      fs::create_hard_link(s / "src/config.json", e.path());
    }
    EXPECT_EQ(kind_of([&] { static_cast<void>(d.lock_shard(name)); }), ErrorKind::Usage);
  }
  EXPECT_EQ(slurp(s / "src/config.json"), "precious");
}

// mx2nv's own link into place (the identity where renameat2 is missing:
// link, then unlink the temporary name) shares an inode for a moment; a
// tree check in that moment is not a refusal.
TEST(Destination, AnIdentityLinkedIntoPlaceIsNotAPlantedLink) {
  Scratch s;
  fs::create_directories(s / "dst/.mx2nv");
  std::ofstream(s / "dst/.mx2nv/.mx2nv-tmp.4.conversion.json") << "{}";
  fs::create_hard_link(s / "dst/.mx2nv/.mx2nv-tmp.4.conversion.json", s / "dst/.mx2nv/conversion.json");
  EXPECT_NO_THROW(Destination(s / "src", s / "dst", true));
  // A third name elsewhere is not that pattern.
  fs::create_hard_link(s / "dst/.mx2nv/conversion.json", s / "elsewhere");
  fs::remove(s / "dst/.mx2nv/.mx2nv-tmp.4.conversion.json");
  EXPECT_EQ(kind_of([&] { Destination(s / "src", s / "dst", true); }), ErrorKind::Usage);
}

// A finished DST whose finalize was killed after its commit point: a tidy
// removes the rest of .mx2nv/ and nothing else, unless someone holds the lock.
TEST(Destination, TidyingAFinishedDstKeepsTheCheckpointAndFinishedJson) {
  Scratch s;
  ShardRecord r;
  r.shard = "one.safetensors";
  r.output_size = 5;
  {
    Destination d(s / "src", s / "dst", false);
    ASSERT_TRUE(d.open_for_writing({}));
    d.write_file(r.shard, "bytes");
    d.write_record(r);
    FinishedRecord f;
    f.tool_version = "test";
    f.window = "marlin";
    f.shards = {r};
    f.index_hash = 1;
    d.finish(f, "model.safetensors.index.json", "{}");
  }
  const auto leftovers = [&] {
    fs::create_directories(s / "dst/.mx2nv/state");
    fs::create_directories(s / "dst/.mx2nv/locks");
    std::ofstream(s / "dst/.mx2nv/state/r.json") << "{}";
    std::ofstream(s / "dst/.mx2nv/locks/r.json.lock");
    std::ofstream(s / "dst/.mx2nv/conversion.json") << "{}";
    std::ofstream(s / "dst/.mx2nv/lock") << "123";
  };
  const auto names = [&] {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(s / "dst/.mx2nv")) out.insert(e.path().filename().string());
    return out;
  };
  leftovers();
  {
    // Held (a step looking at the finished DST): left for the next retry.
    const int fd = ::open((s / "dst/.mx2nv/lock").c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_SH), 0);
    Destination d(s / "src", s / "dst", true);
    ASSERT_EQ(d.state(), DestinationState::Finished);
    d.tidy_finished();
    EXPECT_EQ(names().size(), 5u);
    ::close(fd);
  }
  Destination d(s / "src", s / "dst", true);
  d.tidy_finished();
  EXPECT_EQ(names(), std::set<std::string>{"finished.json"});
  EXPECT_EQ(slurp(s / "dst/one.safetensors"), "bytes");
  EXPECT_EQ(slurp(s / "dst/model.safetensors.index.json"), "{}");
  leftovers();
  fs::remove(s / "dst/.mx2nv/lock");
  Destination::tidy_finished(s / "dst");  // no lock file left: nobody can hold one
  EXPECT_EQ(names(), std::set<std::string>{"finished.json"});
  EXPECT_EQ(Destination(s / "src", s / "dst", true).state(), DestinationState::Finished);
}

}  // namespace
}  // namespace mx2nv
