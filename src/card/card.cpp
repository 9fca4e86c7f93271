#include "card/card.hpp"

#include "card/card_render.hpp"
#include "card/card_text.hpp"
#include "card/evidence.hpp"
#include "card/sha256.hpp"
#include "card/source_card.hpp"
#include "checkpoint/fingerprint.hpp"
#include "checkpoint/argument_check.hpp"
#include "common/error.hpp"
#include "common/printable.hpp"
#include "destination/destination.hpp"
#include "gate/gate.hpp"
#include "safetensors/card_files.hpp"
#include "safetensors/file_names.hpp"
#include "sys/heap.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdlib>
#include <cstring>

namespace mx2nv {
namespace {

constexpr std::uint64_t kMaxSourceCard = 64ull << 20;
constexpr std::uint64_t kMaxGpuLog = 64 << 10;
constexpr std::size_t kMaxGpuLogLines = 200;
constexpr std::uint64_t kMaxConfigBytes = 64ull << 20;

[[noreturn]] void usage(const std::string& why) { fail(ErrorKind::Usage, "card: {}", why); }

std::pair<std::string, std::string> parse_companion(const std::string& text) {
  const std::size_t at = text.find('@');
  const std::string repo = text.substr(0, at);
  const std::string rev = at == std::string::npos ? "" : text.substr(at + 1);
  if (!valid_repo_id(repo)) usage(fmt::format("--companion {}: not a Hugging Face repo id", printable(text)));
  if (at != std::string::npos &&
      (rev.size() != 40 || !std::all_of(rev.begin(), rev.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f'); }))) {
    usage(fmt::format("--companion {}: the revision must be a 40-hex commit (a branch or tag does not name one artifact)",
                      printable(text)));
  }
  return {repo, rev};
}

// The gpu-check log, escaped for a ```text block (controls as \xHH, never a fence).
std::string read_gpu_log(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) usage(fmt::format("--gpu-check {}: not a readable file", printable(path.string())));
  if (static_cast<std::uint64_t>(st.st_size) > kMaxGpuLog) usage("--gpu-check: the log is larger than 64 KiB");
  const std::string log = read_text_file(path, kMaxGpuLog);
  std::string out;
  std::size_t lines = 0;
  bool named = false;
  std::size_t start = 0;
  while (start < log.size()) {
    std::size_t end = log.find('\n', start);
    if (end == std::string::npos) end = log.size();
    const std::string line = log.substr(start, end - start);
    named = named || line.rfind("gpu-check: ", 0) == 0;
    if (line.find("```") != std::string::npos) usage("--gpu-check: the log holds a code fence");
    out += (lines++ ? "\n" : "") + escaped_text(line);
    start = end + 1;
  }
  if (lines > kMaxGpuLogLines) usage("--gpu-check: the log has more than 200 lines");
  while (!out.empty() && out.back() == '\n') out.pop_back();
  if (!named) usage("--gpu-check: not a scripts/gpu-check.sh log (no line starting 'gpu-check: ')");
  return out;
}

// §2.1: "…/models--ORG--NAME/snapshots/<40 hex>" -> (ORG/NAME, rev).
std::pair<std::string, std::string> snapshot_of(const std::string& source) {
  const fs::path p(source);
  std::vector<std::string> parts;
  for (const auto& c : p) parts.push_back(c.string());
  while (!parts.empty() && parts.back().empty()) parts.pop_back();
  if (parts.size() < 3 || parts[parts.size() - 2] != "snapshots") return {};
  const std::string& folder = parts[parts.size() - 3];
  const std::string& rev = parts.back();
  if (folder.rfind("models--", 0) != 0) return {};
  if (rev.size() != 40 || !std::all_of(rev.begin(), rev.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f'); })) {
    return {};
  }
  std::string id = folder.substr(8);
  const std::size_t sep = id.find("--");
  if (sep != std::string::npos) {
    if (id.find("--", sep + 2) != std::string::npos) return {};
    id = id.substr(0, sep) + "/" + id.substr(sep + 2);
  }
  if (!valid_repo_id(id)) return {};
  return {id, rev};
}

bool has_auto_map(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return false;
  try {
    const Json j = parse_strict_json(read_text_file(file, kMaxConfigBytes), file.filename().string()).value;
    return j.is_object() && j.contains("auto_map");
  } catch (const Error&) {
    return false;
  }
}

std::vector<std::string> license_files(const std::vector<std::string>& companions) {
  std::vector<std::string> out;
  for (const auto& c : companions) {
    std::string base = c.substr(c.rfind('/') == std::string::npos ? 0 : c.rfind('/') + 1);
    std::transform(base.begin(), base.end(), base.begin(), [](char ch) { return static_cast<char>(std::toupper(static_cast<unsigned char>(ch))); });
    for (const char* prefix : {"LICENSE", "LICENCE", "COPYING", "NOTICE", "USE_POLICY"}) {
      if (base.rfind(prefix, 0) == 0) {
        out.push_back(c);
        break;
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Rule 8: the report's fingerprints are those of SRC and DST now.
void check_fingerprints(const Evidence& e, const Checkpoint& src, const Checkpoint& dst) {
  const std::optional<Fingerprint>& fp = e.report.fingerprint;
  const char* since = e.kind == EvidenceKind::Verify ? "verify" : "requantize";
  // report_from_json has checked its scheme is kFingerprintScheme.
  if (!fp) {
    usage(fmt::format("the report has no {} fingerprint of SRC and DST ({} again with this mx2nv)", kFingerprintScheme, since));
  }
  if (fp->source != checkpoint_fingerprint(src, CheckpointRole::Source).digest) {
    usage(fmt::format("SRC changed since {} (its files' fingerprint differs from the report's)", since));
  }
  if (fp->target != checkpoint_fingerprint(dst, CheckpointRole::Target).digest) {
    usage(fmt::format("DST changed since {} (its files' fingerprint differs from the report's)", since));
  }
}

// A test hook, not an option: MX2NV_TEST_CARD_KILL_AT=N makes card raise
// SIGKILL at its N-th write step (lock file, temporary created, written,
// synced, renamed, directory synced), so that tests can check that every
// state a killed card leaves is finished by the next run
// (tests/e2e/card_test.cpp). Unset, or not a number: no effect.
class KillPoints {
 public:
  KillPoints() {
    const char* at = std::getenv("MX2NV_TEST_CARD_KILL_AT");
    if (at != nullptr && *at != '\0' && std::all_of(at, at + std::strlen(at), [](char c) { return c >= '0' && c <= '9'; })) {
      kill_at_ = std::strtoull(at, nullptr, 10);
    }
  }
  void step() {
    if (kill_at_ != 0 && ++steps_ == kill_at_) ::raise(SIGKILL);
  }

 private:
  std::uint64_t kill_at_ = 0, steps_ = 0;
};

// A name card writes in DST (a final file, its temporary, the lock) must be
// absent or a regular file with one name: a symlink, a hard link planted
// there, a directory or a FIFO is refused as convert refuses them in DST
// (exit 2, nothing written).
void check_writable(int dir_fd, const std::string& name, const fs::path& root, const fs::path& rel) {
  struct stat st {};
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return;
    fail_io(root / rel, "stat", errno);
  }
  const std::string shown = printable(rel.generic_string());
  if (S_ISLNK(st.st_mode)) {
    fail(ErrorKind::Usage, "DST {} holds a symbolic link, {}; refusing to write where links could lead elsewhere",
         printable(root.string()), shown);
  }
  if (!S_ISREG(st.st_mode)) {
    fail(ErrorKind::Usage, "DST {} holds {}, which is not a regular file", printable(root.string()), shown);
  }
  if (st.st_nlink != 1) {
    fail(ErrorKind::Usage,
         "DST {} holds {}, a file with more than one name (a hard link planted in DST?); refusing to write where it "
         "could lead elsewhere",
         printable(root.string()), shown);
  }
}

UniqueFd open_dir_at(int parent, const std::string& name, const fs::path& root, const fs::path& rel) {
  const int fd = ::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP || errno == ENOTDIR) {
      fail(ErrorKind::Usage, "DST {}: {} is not a directory (a symbolic link?); refusing to write through it",
           printable(root.string()), printable(rel.generic_string()));
    }
    fail_io(root / rel, "open directory", errno);
  }
  return UniqueFd(fd);
}

// DST's root as convert opens it: a symlink to a directory is DST's own name.
UniqueFd open_root(const fs::path& dst) {
  const int fd = ::open(dst.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOTDIR) fail(ErrorKind::Usage, "DST {} exists and is not a directory", printable(dst.string()));
    fail_io(dst, "open directory", errno);
  }
  return UniqueFd(fd);
}

// The files card writes, in order: (directory relative to DST, name).
struct CardFile {
  bool in_state;
  std::string name;
};

std::vector<CardFile> card_files(bool source_card) {
  std::vector<CardFile> out;
  if (source_card) out.push_back({false, std::string(kSourceCardFileName)});
  out.push_back({true, std::string(kCardRecordFileName)});
  out.push_back({false, std::string(kCardFileName)});
  return out;
}

std::string temp_name(const std::string& name) { return std::string(kCardTempPrefix) + name; }

// Every name card will write, and its temporary, checked before anything is
// written.
void check_card_files(int root_fd, int state_fd, const fs::path& root) {
  for (const CardFile& f : card_files(true)) {
    const int dir = f.in_state ? state_fd : root_fd;
    const fs::path rel = f.in_state ? fs::path(kStateDirName) : fs::path();
    check_writable(dir, f.name, root, rel / f.name);
    check_writable(dir, temp_name(f.name), root, rel / temp_name(f.name));
  }
}

// The temporaries a killed card left (regular files: check_card_files ran
// under the same lock), removed once every refusal is past.
void remove_card_temporaries(int root_fd, int state_fd, const fs::path& root) {
  for (const CardFile& f : card_files(true)) {
    const int dir = f.in_state ? state_fd : root_fd;
    const fs::path rel = f.in_state ? fs::path(kStateDirName) : fs::path();
    if (::unlinkat(dir, temp_name(f.name).c_str(), 0) != 0 && errno != ENOENT) {
      fail_io(root / rel / temp_name(f.name), "remove", errno);
    }
  }
}

// One file of DST replaced atomically: a temporary beside it, fsync, rename,
// then the directory's fsync. Never follows a symlink (O_NOFOLLOW on the
// temporary, rename replaces a link rather than writing through it).
void replace_file(int dir_fd, const std::string& name, std::string_view bytes, const fs::path& display,
                  KillPoints& kill) {
  const std::string temp = temp_name(name);
  const File f = File::create_new_at(dir_fd, temp, display / temp);
  kill.step();
  f.write_at(0, std::as_bytes(std::span(bytes.data(), bytes.size())));
  kill.step();
  f.sync();
  kill.step();
  if (::renameat(dir_fd, temp.c_str(), dir_fd, name.c_str()) != 0) fail_io(display / name, "rename", errno);
  kill.step();
  fsync_directory(dir_fd, display);
  kill.step();
}

// convert's lock on DST (DST/.mx2nv/lock, flock), held while the card is
// checked and written, so that no convert --resume, finalize or other card
// runs meanwhile. A finished DST has no lock file: the one used here is
// removed again under the lock (one left by a killed card too).
class CardLock {
 public:
  CardLock(const fs::path& dst, KillPoints& kill) {
    root_fd_ = open_root(dst);
    state_ = open_dir_at(root_fd_.get(), std::string(kStateDirName), dst, kStateDirName);
    const std::string name(kLockFileName);
    const fs::path rel = fs::path(kStateDirName) / name;
    check_writable(state_.get(), name, dst, rel);
    int fd = ::openat(state_.get(), name.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
      fd = ::openat(state_.get(), name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
      if (fd >= 0) kill.step();
    }
    if (fd < 0) {
      check_writable(state_.get(), name, dst, rel);  // planted meanwhile: the same refusal
      fail_io(dst / rel, "open", errno);
    }
    lock_ = UniqueFd(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0) fail_io(dst / rel, "stat", errno);
    if (!S_ISREG(st.st_mode) || st.st_nlink != 1) check_writable(state_.get(), name, dst, rel);
    if (!S_ISREG(st.st_mode)) fail(ErrorKind::Usage, "DST {} holds {}, which is not a regular file", printable(dst.string()), rel.string());
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) fail(ErrorKind::Usage, "card: DST {} is locked by another running mx2nv", printable(dst.string()));
    // The name may have been removed (by the lock's previous holder) between
    // open and flock: then this lock guards nothing.
    struct stat now {};
    if (::fstatat(state_.get(), name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0 || now.st_ino != st.st_ino ||
        now.st_dev != st.st_dev) {
      fail(ErrorKind::Usage, "card: DST {} is locked by another running mx2nv", printable(dst.string()));
    }
  }
  ~CardLock() { ::unlinkat(state_.get(), std::string(kLockFileName).c_str(), 0); }
  CardLock(const CardLock&) = delete;
  CardLock& operator=(const CardLock&) = delete;

  int root_fd() const { return root_fd_.get(); }
  int state_fd() const { return state_.get(); }

 private:
  UniqueFd root_fd_, state_, lock_;
};

}  // namespace

bool valid_repo_id(std::string_view id) {
  if (std::count(id.begin(), id.end(), '/') > 1) return false;
  if (id.find("--") != std::string_view::npos || id.find("..") != std::string_view::npos) return false;
  if (id.size() >= 4 && id.substr(id.size() - 4) == ".git") return false;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = std::min(id.find('/', start), id.size());
    const std::string_view part = id.substr(start, end - start);
    if (part.empty() || part.size() > 96) return false;
    for (const char c : part) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return false;
    }
    if (part.front() == '-' || part.front() == '.' || part.back() == '-' || part.back() == '.') return false;
    if (end == id.size()) return true;
    start = end + 1;
  }
}

namespace {

// Rule 1 of §6: the options, before any file is read.
void check_options(const CardOptions& o) {
  if (o.verify_report.has_value() == o.requantize_report.has_value()) {
    usage("give exactly one of --verify-report and --requantize-report");
  }
  if (o.tp < 1 || o.tp > 1024) usage("--tp must be 1 to 1024");
  // A given option is used or refused: an empty value (an unset shell
  // variable, say) never falls back to "not given".
  const auto given = [](const char* option, const auto& value) {
    if (value && value->empty()) usage(fmt::format("{} was given an empty value", option));
  };
  if (o.source.empty()) usage("SRC was given an empty value");
  if (o.target.empty()) usage("DST was given an empty value");
  given("--base-model", o.base_model);
  given("--companion", o.companion);
  given("--repo-id", o.repo_id);
  given("--gpu-check", o.gpu_check);
  if (o.verify_report && !o.report_text) given("--verify-report", o.verify_report);
  if (o.requantize_report && !o.report_text) given("--requantize-report", o.requantize_report);
  if (o.base_model && !valid_repo_id(*o.base_model)) {
    usage(fmt::format("--base-model {}: not a Hugging Face repo id", printable(*o.base_model)));
  }
  if (o.repo_id && !valid_repo_id(*o.repo_id)) {
    usage(fmt::format("--repo-id {}: not a Hugging Face repo id", printable(*o.repo_id)));
  }
}

// What the card says besides the report and SRC's card: gate on DST, the
// base model, the options, DST's files.
void add_facts(CardFacts& facts, const CardOptions& o, const Evidence& e, const Checkpoint& dst) {
  facts.report = &e.report;
  const std::string& reported_source = e.report.provenance.source;
  std::tie(facts.snapshot_repo, facts.snapshot_rev) = snapshot_of(reported_source);
  facts.base_given = o.base_model.has_value();
  facts.base_model = facts.base_given ? *o.base_model : facts.snapshot_repo;
  if (o.companion) std::tie(facts.companion_repo, facts.companion_rev) = parse_companion(*o.companion);
  facts.repo_id = o.repo_id.value_or("");
  if (o.gpu_check) facts.gpu_log = read_gpu_log(*o.gpu_check);
  facts.tp = o.tp;
  facts.trust_remote_code =
      has_auto_map(o.target / kConfigFileName) || has_auto_map(o.target / "tokenizer_config.json");
  facts.license_files = license_files(dst.companions);
  facts.version = MX2NV_VERSION;
}

// The layout DST's finished record names must be the one its config says
// (what verify judged it by): the card's format statements rest on both.
void check_format(TargetFormat recorded, const Checkpoint& dst) {
  const bool hf_quant_config = std::binary_search(dst.companions.begin(), dst.companions.end(),
                                                  std::string(kModelOptConfigFileName));
  const TargetFormat configured = target_format_of(dst.config_text, hf_quant_config);
  if (configured != recorded) {
    fail(ErrorKind::InvalidInput, "card: DST's finished record says format {}, its config says {}",
         choice_name(recorded), choice_name(configured));
  }
}

// The result the CLI and the Python package report: the card, the keys, the warnings.
CardResult describe(const CardFacts& facts, const CardOptions& o, std::string text) {
  CardResult result;
  result.path = o.target / kCardFileName;
  result.source_card = facts.source.present;
  result.sha256 = sha256_hex(text);
  result.text = std::move(text);
  for (const auto& kv : facts.source.inherited) result.inherited.push_back(kv.first);
  result.dropped = facts.source.dropped;
  result.not_inherited = facts.source.not_inherited;
  result.source_card_problem = facts.source.problem;
  if (!facts.base_model.empty()) {
    result.front_matter.push_back({"base_model", {facts.base_model}});
    result.front_matter.push_back({"base_model_relation", {"quantized"}});
  }
  for (const auto& [k, v] : facts.source.inherited) {
    if (const auto* one = std::get_if<std::string>(&v)) {
      result.front_matter.push_back({k, {*one}});
    } else {
      result.front_matter.push_back({k, std::get<std::vector<std::string>>(v)});
      result.list_keys.push_back(k);
    }
  }
  result.front_matter.push_back({"tags", card_tags(facts)});
  result.list_keys.push_back("tags");
  if (!facts.source.problem.empty()) {
    result.warnings.push_back(fmt::format("SRC's README.md: {}; no metadata inherited", printable(facts.source.problem)));
  }
  for (const auto& k : facts.source.not_inherited) {
    result.warnings.push_back(
        fmt::format("SRC's README.md: {} not inherited (not a string, or control characters)", printable(k)));
  }
  if (facts.base_model.empty()) {
    result.warnings.push_back("no base model (SRC is not a Hugging Face cache snapshot and --base-model was not given)");
  }
  return result;
}

// README.source.md, .mx2nv/card.json, README.md, each atomically
// (docs/reference/model-card.md §7), into the directories the lock holds.
void write_card_files(const CardLock& lock, const fs::path& target, const Evidence& e, const CardResult& r,
                      const std::string& source_bytes, KillPoints& kill) {
  const int root = lock.root_fd(), state = lock.state_fd();
  if (r.source_card) replace_file(root, std::string(kSourceCardFileName), source_bytes, target, kill);
  const Json record = {{"format", "mx2nv-card/1"},
                       {"tool_version", MX2NV_VERSION},
                       {"evidence", e.kind == EvidenceKind::Verify ? "verify" : "requantize"},
                       {"report_sha256", sha256_hex(e.bytes)},
                       {"card_sha256", r.sha256},
                       {"card_bytes", r.text.size()},
                       {"source_card", r.source_card ? Json(kSourceCardFileName) : Json(nullptr)},
                       {"source_card_sha256", r.source_card ? Json(sha256_hex(source_bytes)) : Json(nullptr)}};
  replace_file(state, std::string(kCardRecordFileName), dump_json(record) + "\n", target / kStateDirName, kill);
  replace_file(root, std::string(kCardFileName), r.text, target, kill);
}

}  // namespace

CardResult run_card(const CardOptions& o) {
  check_options(o);
  if (o.gpu_check) check_input_file("--gpu-check", *o.gpu_check, "the log `scripts/gpu-check.sh` prints");
  if (!o.report_text) {
    check_input_file(o.verify_report ? "--verify-report" : "--requantize-report",
                     o.verify_report ? *o.verify_report : *o.requantize_report,
                     o.verify_report ? "the JSON report `mx2nv verify SRC DST --report FILE` writes"
                                     : "the JSON report `mx2nv requantize SRC DST --report FILE` writes");
  }
  check_source_argument({Command::Card, o.source, o.target});
  // A DST that is not there is left to the report's rules (a report of another DST says so first).
  if (std::error_code ec; fs::exists(fs::symlink_status(o.target, ec))) {
    check_converted_argument({Command::Card, o.source, o.target});
  }
  CardFacts facts;
  if (o.companion) parse_companion(*o.companion);  // rule 1, before the report is read
  if (o.gpu_check) read_gpu_log(*o.gpu_check);
  // Rules 2-7: the report, then DST's finished record.
  facts.kind = o.verify_report ? EvidenceKind::Verify : EvidenceKind::Requantize;
  const Evidence e = read_evidence(facts.kind, o.verify_report ? *o.verify_report : *o.requantize_report,
                                   o.report_text ? &*o.report_text : nullptr, o.source, o.target);
  // DST as convert checks it (no symlink, special file or planted hard link
  // anywhere), before its finished record is read and again under the lock:
  // what card opens and writes there is never followed elsewhere.
  std::error_code ec;
  if (fs::is_directory(o.target, ec)) Destination::check_tree(o.target);
  facts.format = check_finished_mode(e, o.target);
  KillPoints kill;
  const CardLock lock(o.target, kill);
  Destination::check_tree(o.target);
  check_card_files(lock.root_fd(), lock.state_fd(), o.target);
  // Rule 8: the files are those the report speaks of.
  // Only the files and companions are used (not the index's tensor names,
  // which at K3's structure would sit beside gate's own tables).
  const auto open_files = [&](const fs::path& root, CheckpointRole role) {
    Checkpoint c = open_checkpoint(root, role, o.threads);
    if (c.index) c.index->forget_tensors();
    release_free_heap();
    return c;
  };
  const Checkpoint src = open_files(o.source, CheckpointRole::Source);
  const Checkpoint dst = open_files(o.target, CheckpointRole::Target);
  check_fingerprints(e, src, dst);

  // Invalid input (exit 3), still before anything is written.
  check_format(facts.format, dst);
  if (std::binary_search(src.companions.begin(), src.companions.end(), std::string(kSourceCardFileName))) {
    fail(ErrorKind::InvalidInput, "card: SRC holds README.source.md; the card cannot keep SRC's README.md beside it");
  }
  std::string source_bytes;
  if (std::binary_search(src.companions.begin(), src.companions.end(), std::string(kCardFileName))) {
    const File f = File::open_read(o.source / kCardFileName);
    // A card this large is no card: refused rather than copied unread
    // (docs/card.md "Hostile source cards").
    if (f.size() > kMaxSourceCard) fail(ErrorKind::InvalidInput, "card: SRC's README.md is larger than 64 MiB");
    source_bytes = read_text_file(f, kMaxSourceCard);
    facts.source = read_source_card(source_bytes);
  }
  GateOptions g;
  g.checkpoint = o.target;
  g.tp = o.tp;
  g.threads = o.threads;
  g.ask.when = AskRuntimes::Never;
  const GateResult gate = run_gate(g);
  facts.gate = &gate;
  add_facts(facts, o, e, dst);
  CardResult result = describe(facts, o, render_card(facts));
  remove_card_temporaries(lock.root_fd(), lock.state_fd(), o.target);
  write_card_files(lock, o.target, e, result, source_bytes, kill);
  return result;
}

}  // namespace mx2nv
