#include "checkpoint/reader.hpp"

#include "common/error.hpp"
#include "common/parallel.hpp"
#include "safetensors/card_files.hpp"
#include "safetensors/file_names.hpp"

#include <algorithm>
#include <mutex>
#include <set>
#include <vector>

namespace mx2nv {
namespace {

// A ticket for the header of `file` (its length prefix, validated), taken
// before the header is parsed.
HeaderTicket header_ticket(const File& file, std::string_view what) {
  std::byte first8[kHeaderLengthBytes] = {};
  const std::uint64_t size = file.size();
  if (size >= kHeaderLengthBytes) file.read_at(0, first8);
  return HeaderTicket(ShardHeader::parse_header_length(first8, size, what));
}

ShardSummary summarise(std::string file, std::uint64_t size, const ShardHeader& h) {
  return {std::move(file), size, h.data_start(), h.data_size(), h.tensors().size()};
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
    // A temporary file of a killed `mx2nv card` is card's, not the checkpoint's.
    if (role == CheckpointRole::Target && is_card_temporary_in_root(name) && it->is_regular_file(ec) &&
        !it->is_symlink(ec)) {
      continue;
    }
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

ShardFiles::ShardFiles(fs::path root, std::vector<std::string> files, std::size_t capacity, CacheUse use)
    : root_(std::move(root)), files_(std::move(files)), capacity_(std::max<std::size_t>(1, capacity)), use_(use) {}

std::unique_ptr<ShardFiles> ShardFiles::pool_for(CacheUse use) const {
  return std::make_unique<ShardFiles>(root_, files_, capacity_, use);
}

std::shared_ptr<const File> ShardFiles::open(std::size_t shard) const {
  {
    std::lock_guard lock(mutex_);
    for (auto it = recent_.begin(); it != recent_.end(); ++it) {
      if (it->first == shard) {
        recent_.splice(recent_.begin(), recent_, it);
        return it->second;
      }
    }
  }
  File opened = File::open_read(root_ / files_[shard]);
  if (use_ != CacheUse::Normal) opened.set_cache_use(use_);
  auto file = std::make_shared<const File>(std::move(opened));
  std::lock_guard lock(mutex_);
  recent_.emplace_front(shard, file);
  if (recent_.size() > capacity_) recent_.pop_back();
  return file;
}

std::uint64_t Checkpoint::tensor_bytes() const {
  std::uint64_t total = 0;
  for (const auto& s : shards) total += s.data_size;
  return total;
}

std::uint64_t Checkpoint::tensor_count() const {
  std::uint64_t total = 0;
  for (const auto& s : shards) total += s.tensors;
  return total;
}

std::optional<std::string> hf_quant_config_of(const Checkpoint& checkpoint) {
  const std::string name(kModelOptConfigFileName);
  if (!std::binary_search(checkpoint.companions.begin(), checkpoint.companions.end(), name)) return std::nullopt;
  return read_text_file(checkpoint.root / name, kMaxConfigBytes);
}

OpenShard Checkpoint::read_shard(std::size_t shard) const {
  const ShardSummary& s = shards[shard];
  OpenShard o{{}, &s, File::open_read(root / s.file), {}};
  o.ticket = header_ticket(o.handle, s.file);
  o.header = ShardHeader::read(FileSource(o.handle), o.handle.size(), s.file);
  if (o.handle.size() != s.size || o.header.data_start() != s.data_start || o.header.tensors().size() != s.tensors) {
    fail_input("{}: changed while mx2nv was reading it", s.file);
  }
  return o;
}

Checkpoint open_checkpoint(const fs::path& root, CheckpointRole role, unsigned threads, const ShardVisitor& visit,
                           const std::function<void(const ShardIndex&)>& on_index) {
  Checkpoint c;
  c.root = root;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) fail(ErrorKind::Usage, "{}: not a directory", root.string());
  const fs::path config = root / std::string(kConfigFileName);
  if (!fs::exists(config, ec)) fail_input("{}: no config.json", root.string());
  c.config_text = read_text_file(config, kMaxConfigBytes);

  std::set<std::string> structural{std::string(kConfigFileName)};
  const fs::path index_path = root / std::string(kIndexFileName);
  std::vector<std::string> files;
  if (fs::exists(index_path, ec)) {
    const File index_file = File::open_read(index_path);
    const std::uint64_t size = index_file.size();
    if (size > kMaxIndexBytes) fail_input("{}: {} bytes exceeds the {} byte limit", kIndexFileName, size, kMaxIndexBytes);
    c.index = read_shard_index(FileSource(index_file), size, kIndexFileName);
    if (role == CheckpointRole::Source) {
      // Every module's packed tensor is indexed (the coverage check), so
      // counting a global per packed tensor bounds the converted index:
      // refuse now, before reading any header, a source whose converted
      // index could not be read back.
      std::uint64_t packed = 0, name_bytes = c.index->tensors.name_bytes();
      for (std::size_t i = 0; i < c.index->tensors.size(); ++i) {
        const std::string_view name = c.index->tensors.name(static_cast<NameTable::Id>(i));
        if (!name.ends_with(kPackedSuffix)) continue;
        ++packed;
        name_bytes += name.size() - kPackedSuffix.size() + kGlobalSuffix.size();
      }
      check_converted_index_caps(c.index->tensors.size() + packed, name_bytes);
    }
    if (on_index) on_index(*c.index);
    structural.insert(std::string(kIndexFileName));
      files = c.index->shard_files;
    for (const auto& file : files) {
      if (!fs::exists(root / file, ec)) fail_input("{}: shard \"{}\" does not exist", kIndexFileName, file);
    }
  } else if (fs::exists(root / std::string(kSingleShardName), ec)) {
    files.emplace_back(kSingleShardName);
  } else {
    fail_input("{}: neither {} nor {}", root.string(), kIndexFileName, kSingleShardName);
  }
  structural.insert(files.begin(), files.end());

  // One pass over the headers, a shard per worker; each header is dropped
  // once checked against the index and shown to the visitor.
  std::optional<IndexCoverage> coverage;
  if (c.index) coverage.emplace(*c.index);
  c.shards.resize(files.size());
  std::mutex mutex;
  parallel_for(files.size(), threads, [&](std::size_t s) {
    const File handle = File::open_read(root / files[s]);
    const std::uint64_t size = handle.size();
    const HeaderTicket ticket = header_ticket(handle, files[s]);
    const ShardHeader header = ShardHeader::read(FileSource(handle), size, files[s]);
    if (coverage) coverage->add_shard(s, header);  // index lookups, in parallel
    std::lock_guard lock(mutex);
    if (visit) visit(s, files[s], header);
    c.shards[s] = summarise(files[s], size, header);
  });
  if (coverage) coverage->finish();
  // Every later use reads the index's names by id (convert writes DST's
  // index from them); no name is looked up again.
  if (c.index) c.index->tensors.drop_lookup();
  c.companions = list_companions(root, structural, role);
  c.files = std::make_unique<ShardFiles>(root, std::move(files));
  return c;
}

SourceCheckpoint open_source_checkpoint(const fs::path& root, unsigned threads, IndexNames index_names) {
  ModuleCollector collector;
  const auto collect = [&](std::size_t shard, std::string_view file, const ShardHeader& header) {
    collector.add_shard(shard, file, header);
  };
  // Every module's packed tensor is indexed, so the index's count is what
  // the collector will hold (bounded by the converted-index cap checked before).
  const auto reserve = [&](const ShardIndex& index) {
    std::size_t packed = 0;
    for (std::size_t i = 0; i < index.tensors.size(); ++i) {
      packed += index.tensors.name(static_cast<NameTable::Id>(i)).ends_with(kPackedSuffix) ? 1u : 0u;
    }
    collector.reserve(packed);
  };
  SourceCheckpoint s{open_checkpoint(root, CheckpointRole::Source, threads, collect, reserve), {}, {}};
  if (s.checkpoint.index) {
    const NameTable& names = s.checkpoint.index->tensors;
    const bool small = names.size() <= kKeptIndexTensors && names.name_bytes() <= kKeptIndexNameBytes;
    if (index_names == IndexNames::Drop || (index_names == IndexNames::KeepIfSmall && !small)) {
      s.checkpoint.index->forget_tensors();
    }
  }
  s.quant = read_source_quant_config(s.checkpoint.config_text);
  s.modules = std::move(collector).finish();
  if (s.modules.modules.empty()) fail_input("{}: no quantized modules (*.weight_packed + *.weight_scale)", root.string());
  return s;
}

}  // namespace mx2nv
