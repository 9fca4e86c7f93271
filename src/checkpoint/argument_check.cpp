#include "checkpoint/argument_check.hpp"

#include "checkpoint/reader.hpp"
#include "common/error.hpp"
#include "json/strict_json.hpp"
#include "model/quant_config.hpp"
#include "plan/plan_file.hpp"
#include "safetensors/file_names.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace mx2nv {
namespace {

// Folders looked into for a checkpoint one or two levels down (a Hugging Face
// cache's models--org--name/snapshots/<rev>/): a bounded look, not a search.
constexpr std::size_t kEntriesLookedAt = 64;

std::string q(const fs::path& p) { return shell_quote(p.string()); }

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}
bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

std::string_view label_of(const CommandPaths& paths, bool target) {
  if (!target) return paths.command == Command::Gate ? "CHECKPOINT" : "SRC";
  return paths.command == Command::Compare ? "OTHER" : "DST";
}

// `mx2nv <command> SRC [DST]` with the given paths (and card's evidence
// option, which it cannot run without).
std::string command_line(Command command, const fs::path& source, const std::optional<fs::path>& target) {
  std::string out = fmt::format("mx2nv {} {}", command_name(command), q(source));
  if (target) out += " " + q(*target);
  if (command == Command::Card) out += " --verify-report REPORT";
  return out;
}

// The nearest folder above `p` that exists ("." for a relative path none of
// whose parents exist).
fs::path existing_ancestor(const fs::path& p) {
  fs::path a = p.lexically_normal();
  if (!a.has_filename() && a.has_parent_path()) a = a.parent_path();
  while (a.has_parent_path() && a.parent_path() != a) {
    a = a.parent_path();
    if (is_dir(a)) return a;
  }
  return a.is_absolute() ? fs::path("/") : fs::path(".");
}

std::string read_small(const fs::path& p) {
  try {
    return read_text_file(p, kMaxConfigBytes);
  } catch (const Error&) {
    return {};  // the strict reader reports it, with its own words
  }
}

// What the tensor names say, for a checkpoint whose config names no
// quantization: the index's names, or the single file's header, when small
// enough to read twice (the reader reads them again, strictly).
enum class NamesSay { Nothing, Packed, StackedExpertBlocks };
NamesSay names_say(const fs::path& dir) {
  constexpr std::uint64_t kLookedAtBytes = 32 << 20;
  std::vector<std::string> names;
  try {
    const fs::path index = dir / std::string(kIndexFileName);
    const fs::path single = dir / std::string(kSingleShardName);
    if (is_file(index)) {
      const Json j = parse_strict_json(read_text_file(index, kLookedAtBytes), "index").value;
      if (j.is_object() && j.contains("weight_map") && j["weight_map"].is_object()) {
        for (const auto& [name, _] : j["weight_map"].items()) names.push_back(name);
      }
    } else if (is_file(single)) {
      const File f = File::open_read(single);
      std::byte prefix[8] = {};
      if (f.size() < 8) return NamesSay::Nothing;
      f.read_at(0, prefix);
      std::uint64_t n = 0;
      for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(prefix[i]);
      if (n > kLookedAtBytes || n > f.size() - 8) return NamesSay::Nothing;
      std::string header(static_cast<std::size_t>(n), '\0');
      f.read_at(8, std::as_writable_bytes(std::span(header)));
      const Json j = parse_strict_json(header, "header").value;
      if (j.is_object()) {
        for (const auto& [name, _] : j.items()) names.push_back(name);
      }
    }
  } catch (const Error&) {
    return NamesSay::Nothing;  // the reader reports what is wrong with them
  }
  bool packed = false;
  for (const auto& name : names) {
    if (name.find("experts.") != std::string::npos &&
        (name.ends_with("_proj_blocks") || name.ends_with("_proj_scales"))) {
      return NamesSay::StackedExpertBlocks;
    }
    packed = packed || name.ends_with("weight_packed") || name.ends_with("weight_scale");
  }
  return packed ? NamesSay::Packed : NamesSay::Nothing;
}

std::optional<QuantizationLook> look_in(const fs::path& dir) {
  const fs::path config = dir / std::string(kConfigFileName);
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(config, ec))) return std::nullopt;
  if (!is_file(config)) return QuantizationLook{};  // a folder, a device, a dangling link: the reader says which
  const std::string text = read_small(config);
  const fs::path hf = dir / std::string(kModelOptConfigFileName);
  QuantizationLook look = look_at_quantization(text, is_file(hf) ? read_small(hf) : std::string());
  if (look.kind == QuantizationKind::Unquantized) {
    // Quantized tensors under a config that names no quantization: not an
    // unquantized model. gpt-oss's stacked blocks are named as such; packed
    // compressed-tensors modules are left to the reader ("no quantization_config").
    switch (names_say(dir)) {
      case NamesSay::StackedExpertBlocks:
        look.kind = QuantizationKind::GptOssMxfp4;  // look.method stays empty: the names said so
        break;
      case NamesSay::Packed: look.kind = QuantizationKind::Unknown; break;
      case NamesSay::Nothing: break;
    }
  }
  return look;
}

// A folder one or two levels below `dir` that holds config.json (a Hugging
// Face cache folder given instead of its snapshot, a checkpoint unpacked
// into a subfolder), if exactly one does.
std::optional<fs::path> checkpoint_below(const fs::path& dir) {
  std::vector<fs::path> found;
  std::size_t seen = 0;
  const auto look = [&](const fs::path& d, int depth, const auto& self) -> void {
    std::error_code ec;
    for (auto it = fs::directory_iterator(d, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      if (++seen > kEntriesLookedAt) return;
      if (!it->is_directory(ec)) continue;
      if (is_file(it->path() / std::string(kConfigFileName))) {
        found.push_back(it->path());
      } else if (depth < 2) {
        self(it->path(), depth + 1, self);
      }
    }
  };
  look(dir, 1, look);
  if (found.size() != 1) return std::nullopt;
  return found.front();
}

bool empty_folder(const fs::path& dir) {
  std::error_code ec;
  return fs::is_empty(dir, ec) && !ec;
}

// Missing, or a file: both refused as usage, with what to look at.
void require_folder(const CommandPaths& paths, bool target) {
  const fs::path& p = target ? *paths.target : paths.source;
  const std::string_view label = label_of(paths, target);
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  if (!fs::exists(st)) {
    if (fs::is_symlink(fs::symlink_status(p, ec))) {
      fail(ErrorKind::Usage, "{} {} is a symbolic link to nothing (its target does not exist); check it: `ls -l {}`",
           label, q(p), q(p));
    }
    std::string next = fmt::format("check the path: `ls {}`", q(existing_ancestor(p)));
    if (target && paths.command != Command::Gate && paths.command != Command::Compare) {
      next = fmt::format("convert into it first: `mx2nv convert {} {}`, or check the path: `ls {}`", q(paths.source),
                         q(p), q(existing_ancestor(p)));
    }
    fail(ErrorKind::Usage, "{} {} does not exist; {}", label, q(p), next);
  }
  if (fs::is_directory(st)) return;
  std::optional<fs::path> dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  if (!is_file(*dir / std::string(kConfigFileName))) dir.reset();
  std::string next;
  if (dir) {
    const fs::path source = target ? paths.source : *dir;
    std::optional<fs::path> other = paths.target;
    if (target) other = *dir;
    next = fmt::format("give the folder that holds it: `{}`", command_line(paths.command, source, other));
  } else {
    next = fmt::format("give the checkpoint's folder, the one holding {} and the *.safetensors files", kConfigFileName);
  }
  fail(ErrorKind::Usage, "{} {} is a file, not a folder: {} is a checkpoint folder; {}", label, q(p), label, next);
}

[[noreturn]] void fail_gpt_oss(std::string_view label, const fs::path& p, const QuantizationLook& look) {
  const std::string evidence = look.method.empty()
                                   ? std::string("no quantization_config, but tensors named experts.*_blocks and _scales")
                                   : fmt::format("{}.quant_method \"{}\"", look.where, look.method);
  fail_input(
      "{} {} is gpt-oss's MXFP4 layout ({}: each layer's experts stacked in 3-D tensors such as "
      "model.layers.0.mlp.experts.gate_up_proj_blocks and _scales), which mx2nv does not support: it reads "
      "compressed-tensors {} checkpoints, a 2-D weight_packed and weight_scale per expert projection, and no "
      "runtime loads an NVFP4 form of this stacked layout that mx2nv could write (vLLM and SGLang load gpt-oss from "
      "this mxfp4 layout as it is). Serve it as it is, e.g. `vllm serve {}`",
      label, q(p), evidence, kSourceFormat, q(p));
}

[[noreturn]] void fail_unquantized(std::string_view label, const fs::path& p, std::string_view expected,
                                   std::string_view next) {
  fail_input(
      "{} {} is not quantized: its {} has no quantization_config (its weights are stored unquantized, e.g. BF16); "
      "{}. An unquantized model becomes NVFP4A16 only by quantizing it (lossy, e.g. llm-compressor's NVFP4A16 "
      "scheme), which mx2nv does not do: it transcodes MXFP4 checkpoints without loss. {}",
      label, q(p), kConfigFileName, expected, next);
}

std::string describe(const QuantizationLook& look) {
  if (look.kind == QuantizationKind::ModelOptNvfp4) {
    return fmt::format("ModelOpt {}, in {}", look.format.empty() ? "NVFP4" : look.format,
                       look.where.empty() ? std::string(kConfigFileName) : look.where);
  }
  return fmt::format("compressed-tensors {}, in {}", look.format, look.where);
}

std::string suggested_target(const fs::path& source) {
  fs::path s = source.lexically_normal();
  if (!s.has_filename() && s.has_parent_path()) s = s.parent_path();
  return s.string() + "-nvfp4";
}

}  // namespace

std::string shell_quote(std::string_view text) {
  const bool plain = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("@%+=:,./_-").find(c) != std::string_view::npos;
  });
  if (plain && text.front() != '-') return std::string(text);
  std::string out = "'";
  for (const char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::optional<Unfinished> unfinished_conversion(const fs::path& dir, const std::optional<fs::path>& source) {
  const fs::path state = dir / std::string(kStateDirName);
  const std::string src = source ? q(*source) : std::string("SRC");
  const std::string src_note = source ? "" : " (SRC: the MXFP4 checkpoint it is converted from)";
  if (is_dir(state)) {
    const bool finished = is_file(state / std::string(kFinishedFileName)) &&
                          is_file(dir / std::string(kConfigFileName)) &&
                          (is_file(dir / std::string(kIndexFileName)) || is_file(dir / std::string(kSingleShardName)));
    if (finished) return std::nullopt;
    const fs::path plan = state / std::string(kPlanFileName);
    if (is_file(plan)) {
      return Unfinished{
          "an unfinished conversion, planned by mx2nv plan (its shard steps or its finalize have not all run)",
          fmt::format("run its shard steps, then finalize: `mx2nv convert --plan {} --shards 0/1` then `mx2nv convert "
                      "--plan {} --finalize`",
                      q(plan), q(plan))};
    }
    return Unfinished{"an unfinished conversion (mx2nv convert was interrupted, or is still running, before it wrote "
                      "the index last)",
                      fmt::format("run `mx2nv convert {} {} --resume`{}", src, q(dir), src_note)};
  }
  // Temporary files without a state folder: a run killed while writing.
  std::error_code ec;
  std::size_t seen = 0;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    if (++seen > kEntriesLookedAt) break;
    if (it->path().filename().string().starts_with(kTempPrefix)) {
      return Unfinished{"an unfinished conversion (it holds mx2nv's temporary files)",
                        fmt::format("run `mx2nv convert {} {} --resume`{}", src, q(dir), src_note)};
    }
  }
  return std::nullopt;
}

void check_source_argument(const CommandPaths& paths) {
  require_folder(paths, false);
  const fs::path& p = paths.source;
  const std::optional<QuantizationLook> look = look_in(p);
  if (!look) {
    if (const auto u = unfinished_conversion(p, std::nullopt)) {
      fail_input("SRC {} is {}, not an MXFP4 source; to finish it, {}", q(p), u->why, u->next);
    }
    if (empty_folder(p)) fail_input("SRC {} is an empty folder: no checkpoint there; check the path: `ls {}`", q(p), q(existing_ancestor(p)));
    if (const auto below = checkpoint_below(p)) {
      fail_input("SRC {} holds no {}; the checkpoint is in {}: `{}`", q(p), kConfigFileName, q(*below),
                 command_line(paths.command, *below, paths.target));
    }
    fail_input("SRC {} holds no {}, so it is not a checkpoint folder (one holding {} and the *.safetensors files); "
               "look inside: `ls {}`",
               q(p), kConfigFileName, kConfigFileName, q(p));
  }
  switch (look->kind) {
    case QuantizationKind::CompressedNvfp4:
    case QuantizationKind::ModelOptNvfp4: {
      const bool pair = paths.command == Command::Verify || paths.command == Command::Card ||
                        paths.command == Command::Compare;
      if (pair && paths.target && is_dir(*paths.target)) {
        const auto other = look_in(*paths.target);
        if (other && other->kind == QuantizationKind::CompressedMxfp4) {
          fail_input("SRC {} is NVFP4 and {} {} is MXFP4: they are swapped; run `{}`", q(p),
                     label_of(paths, true), q(*paths.target), command_line(paths.command, *paths.target, p));
        }
      }
      fail_input("SRC {} is already NVFP4 ({}): nothing to convert (SRC is the MXFP4 checkpoint); to check it for "
                 "the runtimes, run `mx2nv gate {}`",
                 q(p), describe(*look), q(p));
    }
    case QuantizationKind::GptOssMxfp4: fail_gpt_oss("SRC", p, *look);
    case QuantizationKind::Unquantized:
      fail_unquantized("SRC", p, "SRC must be a compressed-tensors MXFP4 checkpoint",
                       fmt::format("Give it the model's MXFP4 checkpoint instead: `{}`",
                                   command_line(paths.command, "MXFP4_SRC", paths.target)));
    case QuantizationKind::CompressedMxfp4:
    case QuantizationKind::Other:
    case QuantizationKind::Unknown: return;  // the strict reader decides, with its own messages
  }
}

void check_converted_argument(const CommandPaths& paths) {
  const bool gate = paths.command == Command::Gate;
  const bool target = !gate;
  require_folder(paths, target);
  const fs::path& p = gate ? paths.source : *paths.target;
  const std::string_view label = label_of(paths, target);
  const std::optional<fs::path> source = gate ? std::nullopt : std::optional<fs::path>(paths.source);
  if (const auto u = unfinished_conversion(p, source)) fail_input("{} {} is {}: {}", label, q(p), u->why, u->next);
  const std::optional<QuantizationLook> look = look_in(p);
  const std::string convert_first =
      gate ? fmt::format("`mx2nv convert {} {}`", q(p), shell_quote(suggested_target(p)))
           : fmt::format("`mx2nv convert {} {}`", q(paths.source), q(p));
  if (!look) {
    if (empty_folder(p)) {
      fail_input("{} {} is an empty folder: nothing has been converted into it; {}", label, q(p),
                 paths.command == Command::Compare ? fmt::format("check the path: `ls {}`", q(existing_ancestor(p)))
                                                   : "convert first: " + convert_first);
    }
    return;  // the strict reader names what is missing
  }
  const std::string wants =
      paths.command == Command::Compare
          ? fmt::format("compare measures an NVFP4 checkpoint (compressed-tensors {} or ModelOpt NVFP4)", kTargetFormat)
      : gate ? fmt::format("gate checks an NVFP4 checkpoint (compressed-tensors {})", kTargetFormat)
             : fmt::format("it must be the NVFP4 checkpoint ({}) mx2nv wrote", kTargetFormat);
  switch (look->kind) {
    case QuantizationKind::CompressedMxfp4:
      if (gate) {
        fail_input("{} {}: this is MXFP4 ({}), and gate checks the NVFP4 checkpoint a conversion writes: convert it "
                   "first: {}, then run `mx2nv gate {}`",
                   label, q(p), kSourceFormat, convert_first, shell_quote(suggested_target(p)));
      }
      fail_input("{} {} is MXFP4 ({}), not NVFP4: {} (is it SRC given twice, or SRC and {} swapped?); {}", label, q(p),
                 kSourceFormat, wants, label,
                 paths.command == Command::Compare ? fmt::format("run `mx2nv compare SRC NVFP4_CHECKPOINT`")
                                                   : "convert first: " + convert_first);
    case QuantizationKind::GptOssMxfp4: fail_gpt_oss(label, p, *look);
    case QuantizationKind::Unquantized: {
      std::string next;
      if (gate) {
        next = fmt::format("Convert the model's MXFP4 checkpoint and gate the result: `mx2nv convert MXFP4_SRC {}`",
                           shell_quote(suggested_target(p)));
      } else if (paths.command == Command::Compare) {
        next = fmt::format("Give the NVFP4 checkpoint as OTHER: `mx2nv compare {} NVFP4_CHECKPOINT`", q(paths.source));
      } else {
        next = fmt::format("Convert SRC into a new folder and give that as DST: `mx2nv convert {} NVFP4_DST`",
                           q(paths.source));
      }
      fail_unquantized(label, p, wants, next);
    }
    case QuantizationKind::CompressedNvfp4:
    case QuantizationKind::ModelOptNvfp4:
    case QuantizationKind::Other:
    case QuantizationKind::Unknown: return;
  }
}

void check_new_destination(const CommandPaths& paths) {
  const fs::path& p = *paths.target;
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st)) {
      fail(ErrorKind::Usage,
           "DST {} exists and is a file, not a folder: DST is the folder the converted checkpoint is written to (absent "
           "or empty); choose another: `{}`",
           q(p), command_line(paths.command, paths.source, fs::path(suggested_target(paths.source))));
    }
    return;
  }
  if (fs::is_symlink(fs::symlink_status(p, ec))) return;  // the destination's own checks refuse links
  fs::path parent = p.lexically_normal();
  if (!parent.has_filename() && parent.has_parent_path()) parent = parent.parent_path();
  parent = parent.parent_path();
  if (parent.empty()) return;  // the current folder
  const fs::file_status pst = fs::status(parent, ec);
  if (!fs::exists(pst)) {
    fail(ErrorKind::Io, "DST {}: its parent folder {} does not exist, so DST cannot be created there; create it "
         "first: `mkdir -p {}`",
         q(p), q(parent), q(parent));
  }
  if (!fs::is_directory(pst)) {
    fail(ErrorKind::Io, "DST {}: its parent {} is a file, not a folder, so DST cannot be created there; choose "
         "another: `{}`",
         q(p), q(parent), command_line(paths.command, paths.source, fs::path(suggested_target(paths.source))));
  }
}

void check_input_file(std::string_view option, const fs::path& file, std::string_view what) {
  std::error_code ec;
  const fs::file_status st = fs::status(file, ec);
  if (!fs::exists(st)) {
    fail(ErrorKind::Usage, "{} {} does not exist; it is {}: check the path: `ls {}`", option, q(file), what,
         q(existing_ancestor(file)));
  }
  if (fs::is_directory(st)) {
    const fs::path plan = file / std::string(kStateDirName) / std::string(kPlanFileName);
    if (option == "--plan" && is_file(plan)) {
      fail(ErrorKind::Usage, "{} {} is a folder; {} takes a file: that DST's plan is {}: `mx2nv convert --plan {} ...`",
           option, q(file), option, q(plan), q(plan));
    }
    fail(ErrorKind::Usage, "{} {} is a folder; {} takes a file, {}: give the file's path", option, q(file), option,
         what);
  }
}

}  // namespace mx2nv
