// The path arguments of mx2nv's commands, checked before anything else reads
// them, so that the first wrong input a user gives gets plain words, the
// path concerned and the command to run next, instead of whichever deeper
// check it would trip first (a tensor's dtype, a missing index, a failed
// mkdir). Every refusal is an Error with the documented exit code:
//   Usage (2)         a path that does not exist, a file where a folder is
//                     expected or a folder where a file is expected;
//   InvalidInput (3)  a folder that holds the wrong kind of checkpoint:
//                     already NVFP4, gpt-oss's mxfp4 layout, unquantized,
//                     MXFP4 where NVFP4 is expected, an unfinished conversion;
//   Io (4)            a new DST whose parent is missing or a file: creating
//                     it is what the system refuses (as it did before these
//                     checks, with a plainer message now).
// What passes is read by the strict readers afterwards as before; these
// checks only look at the folder, config.json and hf_quant_config.json.
#pragma once

#include "common/command.hpp"
#include "sys/file.hpp"

#include <optional>
#include <string>
#include <string_view>

namespace mx2nv {

// The command being checked and its checkpoint paths, for the commands the
// messages suggest: `source` is SRC (gate: its CHECKPOINT), `target` DST or
// OTHER where the command has one.
struct CommandPaths {
  Command command;
  fs::path source;
  std::optional<fs::path> target;
};

// SRC of convert, inspect, plan, requantize, verify, compare and card: an
// existing folder holding a compressed-tensors MXFP4 checkpoint.
void check_source_argument(const CommandPaths& paths);

// A checkpoint mx2nv is to read as converted: DST of verify and card, OTHER
// of compare, gate's CHECKPOINT (paths.source for gate, paths.target
// otherwise). An existing folder holding a finished NVFP4 checkpoint, not
// an MXFP4 one and not a conversion still under way or interrupted.
void check_converted_argument(const CommandPaths& paths);

// DST of convert, plan and requantize: absent or a folder, in a folder that
// exists (DST itself is created, its parents are not).
void check_new_destination(const CommandPaths& paths);

// A file a command reads (card's --verify-report / --requantize-report /
// --gpu-check, convert's --plan): exists and is not a folder. `what` says
// what the file is and which command writes it, for the message.
void check_input_file(std::string_view option, const fs::path& file, std::string_view what);

// Why `dir` is an unfinished mx2nv conversion, and the command that finishes
// it (`source`: its SRC where known); nullopt for anything else.
struct Unfinished {
  std::string why;
  std::string next;
};
std::optional<Unfinished> unfinished_conversion(const fs::path& dir, const std::optional<fs::path>& source);

// `text` as one word for a POSIX shell: unchanged when it holds only
// characters no shell treats specially, else in single quotes.
std::string shell_quote(std::string_view text);

}  // namespace mx2nv
