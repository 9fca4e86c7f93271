// A scratch directory for the io tests, with an empty "src" inside (the
// source a Destination is checked against); removed with everything in it.
#pragma once

#include "sys/file.hpp"

#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

namespace mx2nv {

class Scratch {
 public:
  Scratch() {
    std::string tmpl = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/mx2nv-io-XXXXXX";
    root_ = ::mkdtemp(tmpl.data());
    fs::create_directories(root_ / "src");
  }
  ~Scratch() { fs::remove_all(root_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  fs::path operator/(const std::string& p) const { return root_ / p; }

 private:
  fs::path root_;
};

// Writes `size` random bytes (from `seed`) to a new file at `path`, synced
// (clean: an eviction can drop its pages), and returns them.
inline std::vector<std::byte> write_random_file(const fs::path& path, std::size_t size, unsigned seed) {
  std::vector<std::byte> bytes(size);
  std::mt19937 rng(seed);
  for (auto& b : bytes) b = static_cast<std::byte>(rng() & 0xFF);
  File f = File::create_new(path);
  f.write_at(0, bytes);
  f.sync();
  f.close();
  return bytes;
}

}  // namespace mx2nv
