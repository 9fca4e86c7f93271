#include "io/checkpoint_reader.hpp"

#include "core/error.hpp"
#include "core/checkpoint_names.hpp"

#include <algorithm>
#include <set>
#include <vector>

namespace mx2nv {
namespace {

OpenShard open_shard(const fs::path& root, const std::string& file) {
  OpenShard s;
  s.file = file;
  s.handle = File::open_read(root / file);
  s.size = s.handle.size();
  std::byte first8[kHeaderLengthBytes] = {};
  if (s.size >= kHeaderLengthBytes) s.handle.read_at(0, first8);
  const std::uint64_t n = ShardHeader::parse_header_length(first8, s.size, file);
  std::string json(static_cast<std::size_t>(n), '\0');
  s.handle.read_at(kHeaderLengthBytes, std::as_writable_bytes(std::span(json)));
  s.header = ShardHeader::parse(json, s.size, file);
  return s;
}

// Every regular file below root except the ones named in `skip`, following
// symlinks to files; a .git folder (a local clone's history) is not a
// companion, nor is a converted checkpoint's .mx2nv folder (mx2nv's own
// record of the run). Directory symlinks are followed with a depth cap
// against loops. A source may not hold names mx2nv reserves.
std::vector<std::string> list_companions(const fs::path& root, const std::set<std::string>& skip,
                                         CheckpointRole role) {
  std::vector<std::string> out;
  std::error_code ec;
  auto it = fs::recursive_directory_iterator(root, fs::directory_options::follow_directory_symlink, ec);
  if (ec) fail(ErrorKind::Io, "{}: list directory: {}", root.string(), ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) fail(ErrorKind::Io, "{}: list directory: {}", root.string(), ec.message());
    if (it.depth() > 16) fail_input("{}: directories nest deeper than 16 levels (symlink loop?)", root.string());
    const fs::path rel = it->path().lexically_relative(root);
    if (it->is_directory(ec)) {
      if (rel == ".git" || (role == CheckpointRole::Target && rel == kStateDirName)) {
        it.disable_recursion_pending();
        continue;
      }
    }
    const std::string name = rel.generic_string();
    if (role == CheckpointRole::Source && is_reserved_name(name)) {
      fail_input("{}: names starting with \"{}\" are reserved for mx2nv's state and temporary files; SRC may not "
                 "hold them (a temporary file of an interrupted mx2nv run means SRC is not a finished checkpoint)",
                 name, kStateDirName);
    }
    if (it->is_directory(ec)) continue;
    if (!it->is_regular_file(ec)) {
      fail_input("{}: not a regular file (device, socket or dangling link)", it->path().string());
    }
    if (name.find(kTempPrefix) != std::string::npos) {
      fail_input("{}: a temporary file of an interrupted mx2nv run; the checkpoint is not finished", name);
    }
    if (!skip.count(name)) out.push_back(name);
    if (out.size() > kMaxCompanionFiles) fail_input("{}: more than {} files", root.string(), kMaxCompanionFiles);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<ShardTensors> Checkpoint::shard_tensors() const {
  std::vector<ShardTensors> out;
  for (const auto& s : shards) out.push_back({s.file, &s.header});
  return out;
}

std::uint64_t Checkpoint::tensor_bytes() const {
  std::uint64_t total = 0;
  for (const auto& s : shards) total += s.header.data_size();
  return total;
}

Checkpoint open_checkpoint(const fs::path& root, CheckpointRole role) {
  Checkpoint c;
  c.root = root;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) fail(ErrorKind::Usage, "{}: not a directory", root.string());
  const fs::path config = root / std::string(kConfigFileName);
  if (!fs::exists(config, ec)) fail_input("{}: no config.json", root.string());
  c.config_text = read_text_file(config, kMaxConfigBytes);

  std::set<std::string> structural{std::string(kConfigFileName)};
  const fs::path index_path = root / std::string(kIndexFileName);
  if (fs::exists(index_path, ec)) {
    c.index = parse_shard_index(read_text_file(index_path, kMaxIndexBytes), kIndexFileName);
    structural.insert(std::string(kIndexFileName));
    for (const auto& file : c.index->shard_files) {
      if (!fs::exists(root / file, ec)) fail_input("{}: shard \"{}\" does not exist", kIndexFileName, file);
      c.shards.push_back(open_shard(root, file));
      structural.insert(file);
    }
    std::vector<const ShardHeader*> headers;
    for (const auto& s : c.shards) headers.push_back(&s.header);
    check_index_matches_shards(*c.index, headers);
  } else if (fs::exists(root / std::string(kSingleShardName), ec)) {
    c.shards.push_back(open_shard(root, std::string(kSingleShardName)));
    structural.insert(std::string(kSingleShardName));
  } else {
    fail_input("{}: neither {} nor {}", root.string(), kIndexFileName, kSingleShardName);
  }
  c.companions = list_companions(root, structural, role);
  return c;
}

SourceCheckpoint open_source_checkpoint(const fs::path& root) {
  SourceCheckpoint s{open_checkpoint(root, CheckpointRole::Source), {}, {}};
  s.quant = read_source_quant_config(s.checkpoint.config_text);
  s.modules = discover_modules(s.checkpoint.shard_tensors());
  if (s.modules.modules.empty()) fail_input("{}: no quantized modules (*.weight_packed + *.weight_scale)", root.string());
  return s;
}

Report start_report(std::string command, Window window, const fs::path& source, const fs::path* target) {
  Report r;
  r.command = std::move(command);
  r.window = window;
  r.provenance.source = fs::absolute(source).lexically_normal().string();
  r.provenance.revision = hf_snapshot_revision(r.provenance.source);
  if (target != nullptr) r.provenance.target = fs::absolute(*target).lexically_normal().string();
  return r;
}

}  // namespace mx2nv
