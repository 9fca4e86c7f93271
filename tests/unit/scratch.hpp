// A scratch directory for the io tests, with an empty "src" inside (the
// source a Destination is checked against); removed with everything in it.
#pragma once

#include "sys/file.hpp"

#include <cstdlib>
#include <filesystem>
#include <string>

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

}  // namespace mx2nv
