// The commit queue on its own: files committed off the workers' threads, in
// place with their callbacks run once finish() returns; a failure reaches the
// caller; what was still queued when a run fails is left to the
// destination's clean-up, never committed.
#include "destination/commit_queue.hpp"

#include "common/error.hpp"
#include "scratch.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>

namespace mx2nv {
namespace {

Destination::Pending written(Destination& d, const std::string& name) {
  Destination::Pending p = d.begin(name);
  p.file.write_at(0, std::as_bytes(std::span(name)));
  return p;
}

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

TEST(CommitQueue, CommitsEveryFileFromManyWorkersThenRunsItsCallback) {
  Scratch s;
  Destination d(s / "src", s / "dst", false);
  ASSERT_TRUE(d.open_for_writing({}));
  std::atomic<int> after{0};
  {
    CommitQueue q(d, 2);
    std::vector<std::jthread> workers;
    for (int w = 0; w < 4; ++w) {
      workers.emplace_back([&, w] {
        for (int i = 0; i < 25; ++i) {
          const std::string name = "f" + std::to_string(w) + "-" + std::to_string(i);
          q.push(written(d, name), [&, name] {
            EXPECT_TRUE(fs::exists(s / "dst" / name)) << "callback before the rename";
            ++after;
          });
        }
      });
    }
    workers.clear();
    q.finish();
    EXPECT_EQ(after.load(), 100);
  }
  const std::set<std::string> names = names_in(s / "dst");
  EXPECT_EQ(names.size(), 101u);  // and .mx2nv: no temporary file left
  for (const auto& n : names) EXPECT_EQ(n.rfind(".mx2nv-tmp", 0), std::string::npos) << n;
}

TEST(CommitQueue, ACallbackErrorReachesFinishAndTheNextPush) {
  Scratch s;
  Destination d(s / "src", s / "dst", false);
  ASSERT_TRUE(d.open_for_writing({}));
  CommitQueue q(d, 1);
  q.push(written(d, "a"), [] { fail(ErrorKind::Io, "disk on fire"); });
  try {
    q.finish();
    ADD_FAILURE() << "finish() hid the error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Io);
    EXPECT_NE(std::string(e.what()).find("disk on fire"), std::string::npos);
  }
  EXPECT_THROW(q.push(written(d, "b"), {}), Error);
}

TEST(CommitQueue, WhatIsQueuedWhenARunFailsIsNeverCommitted) {
  Scratch s;
  {
    Destination d(s / "src", s / "dst", false);
    ASSERT_TRUE(d.open_for_writing({}));
    std::atomic<bool> started{false}, release{false};
    // Destroyed after the queue: lets the first callback go only once the
    // queue's destructor (a run failing elsewhere) has begun.
    std::jthread releaser([&] {
      while (!started.load()) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      release = true;
    });
    CommitQueue q(d, 4);
    q.push(written(d, "first"), [&] {
      started = true;
      while (!release.load()) std::this_thread::yield();
    });
    q.push(written(d, "second"), {});
    q.push(written(d, "third"), {});
    while (!started.load()) std::this_thread::yield();
  }
  // The destination abandoned the run: a committed file stays for --resume,
  // queued ones were never renamed into place and their temporaries are gone.
  EXPECT_TRUE(fs::exists(s / "dst" / "first"));
  EXPECT_FALSE(fs::exists(s / "dst" / "second"));
  EXPECT_FALSE(fs::exists(s / "dst" / "third"));
  for (const auto& n : names_in(s / "dst")) EXPECT_EQ(n.rfind(".mx2nv-tmp", 0), std::string::npos) << n;
}

}  // namespace
}  // namespace mx2nv
