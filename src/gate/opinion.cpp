#include "gate/opinion.hpp"

#include "gate/rules.hpp"

#include "common/error.hpp"
#include "common/printable.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace mx2nv {
namespace {

constexpr int kProtocol = 1;           // python/mx2nv/runtime_probe.py PROTOCOL
constexpr std::size_t kMaxText = 2000;  // characters kept of any string the probe sends
constexpr std::size_t kMaxArgs = 16;

// The release gate's rules were read from (gate/rules.cpp's backend table).
std::string pinned_of(Runtime runtime) {
  for (const RuntimeBackend& b : runtime_backends()) {
    if (b.runtime == runtime) return std::string(b.version);
  }
  return {};
}

std::string capped(std::string s) {
  if (s.size() > kMaxText) {
    std::size_t n = kMaxText;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // not inside a UTF-8 character
    s.resize(n);
    s += "...";
  }
  return s;
}

const Json& member(const Json& object, const char* key, Json::value_t type, std::string_view where) {
  const auto it = object.find(key);
  const bool ok = it != object.end() &&
                  (it->type() == type || (type == Json::value_t::number_integer && it->is_number_integer()));
  if (!ok) fail_input("runtime probe answer: {} needs \"{}\" ({})", where, key, Json(type).type_name());
  return *it;
}

std::string string_member(const Json& object, const char* key, std::string_view where) {
  return capped(member(object, key, Json::value_t::string, where).get<std::string>());
}

// "Class(a=1, b=True)" from the recorded keyword arguments (scalars only).
std::string call_text(const std::string& cls, const Json& args) {
  std::string s = cls + "(";
  bool first = true;
  for (const auto& [k, v] : args.items()) {
    s += fmt::format("{}{}={}", first ? "" : ", ", k, v.is_boolean() ? (v.get<bool>() ? "True" : "False") : v.dump());
    first = false;
  }
  return capped(s + ")");
}

}  // namespace

std::string_view answer_name(RuntimeOpinion::Answer a) {
  switch (a) {
    case RuntimeOpinion::Answer::NotInstalled: return "not-installed";
    case RuntimeOpinion::Answer::Selected: return "selected";
    case RuntimeOpinion::Answer::Refused: return "refused";
    case RuntimeOpinion::Answer::CouldNotAsk: return "could-not-ask";
  }
  return "could-not-ask";
}

std::string_view agreement_name(Agreement a) {
  switch (a) {
    case Agreement::NoOpinion: return "NO OPINION";
    case Agreement::Agrees: return "AGREES";
    case Agreement::Disagrees: return "DISAGREES";
  }
  return "NO OPINION";
}

bool selects_nvfp4a16(Runtime runtime, std::string_view cls, const Json& args) {
  const auto flag = [&](const char* key, bool absent) {
    const auto it = args.find(key);
    return it == args.end() ? absent : (it->is_boolean() && it->get<bool>());
  };
  if (runtime == Runtime::Vllm) {
    // vLLM 0.34.0 compressed_tensors_moe.py:145-160: NVFP4 weights select
    // CompressedTensorsW4A4Nvfp4MoEMethod, weight-only when use_a16=True
    // (input_quant is None); use_a16=False is W4A4.
    return cls == "CompressedTensorsW4A4Nvfp4MoEMethod" && flag("use_a16", false);
  }
  // SGLang 0.5.23 compressed_tensors.py:959-961; :975 builds the same
  // scheme with has_input_global_scale=True to serve a W4A4 checkpoint
  // weight-only below sm100: not the checkpoint's own scheme.
  return cls == "CompressedTensorsW4A16Nvfp4MoE" && !flag("has_input_global_scale", false);
}

std::vector<RuntimeOpinion> could_not_ask(const std::vector<Runtime>& asked, const std::string& reason) {
  std::vector<RuntimeOpinion> out;
  for (const auto& r : asked) {
    RuntimeOpinion o;
    o.runtime = r;
    o.pinned = pinned_of(r);
    o.reason = capped(reason);
    out.push_back(std::move(o));
  }
  return out;
}

ProbeAnswer parse_probe_answer(std::string_view text, const std::vector<Runtime>& asked) {
  const Json doc = parse_strict_json(text, "runtime probe answer").value;
  if (!doc.is_object()) fail_input("runtime probe answer: not a JSON object");
  if (member(doc, "probe", Json::value_t::number_integer, "the answer") != kProtocol) {
    fail_input("runtime probe answer: protocol {} (this mx2nv speaks {})", doc["probe"].dump(), kProtocol);
  }
  ProbeAnswer answer;
  answer.python_version = string_member(doc, "python", "the answer");
  const Json& runtimes = member(doc, "runtimes", Json::value_t::array, "the answer");
  std::vector<Runtime> seen;
  for (const Json& r : runtimes) {
    if (!r.is_object()) fail_input("runtime probe answer: a runtime entry is not an object");
    RuntimeOpinion o;
    const std::string name = string_member(r, "runtime", "a runtime entry");
    const auto runtime = parse_choice<Runtime>(name);
    if (!runtime || std::find(asked.begin(), asked.end(), *runtime) == asked.end()) {
      fail_input("runtime probe answer: runtime \"{}\" was not asked", printable(name));
    }
    o.runtime = *runtime;
    if (std::find(seen.begin(), seen.end(), o.runtime) != seen.end()) {
      fail_input("runtime probe answer: runtime \"{}\" answered twice", name);
    }
    seen.push_back(o.runtime);
    const std::string where = fmt::format("runtime \"{}\"", name);
    o.pinned = pinned_of(o.runtime);
    o.version = string_member(r, "version", where);
    o.reason = string_member(r, "reason", where);
    const std::string outcome = string_member(r, "outcome", where);
    if (outcome == "not-installed") {
      o.answer = RuntimeOpinion::Answer::NotInstalled;
    } else if (outcome == "refused") {
      o.answer = RuntimeOpinion::Answer::Refused;
    } else if (outcome == "could-not-ask") {
      o.answer = RuntimeOpinion::Answer::CouldNotAsk;
    } else if (outcome == "selected") {
      o.answer = RuntimeOpinion::Answer::Selected;
      const Json& sel = member(r, "selected", Json::value_t::object, where);
      const std::string cls = string_member(sel, "class", where);
      const Json& args = member(sel, "args", Json::value_t::object, where);
      if (args.size() > kMaxArgs) fail_input("runtime probe answer: {}: more than {} arguments", where, kMaxArgs);
      for (const auto& [k, v] : args.items()) {
        if (k.size() > 64 || !(v.is_primitive())) {
          fail_input("runtime probe answer: {}: arguments must be short names with scalar values", where);
        }
      }
      o.selected = call_text(cls, args);
      o.selects_nvfp4a16 = selects_nvfp4a16(o.runtime, cls, args);
    } else {
      fail_input("runtime probe answer: {}: unknown outcome \"{}\"", where, printable(outcome));
    }
    answer.runtimes.push_back(std::move(o));
  }
  for (const auto& r : asked) {
    if (std::find(seen.begin(), seen.end(), r) == seen.end()) {
      auto missing = could_not_ask({r}, "the probe's answer has no entry for it");
      answer.runtimes.push_back(std::move(missing.front()));
    }
  }
  // The order gate asked in, whatever order the probe answered in.
  std::stable_sort(answer.runtimes.begin(), answer.runtimes.end(), [&](const auto& a, const auto& b) {
    return std::find(asked.begin(), asked.end(), a.runtime) < std::find(asked.begin(), asked.end(), b.runtime);
  });
  return answer;
}

Agreement agreement(const RuntimeOpinion& o, bool gate_selects) {
  switch (o.answer) {
    case RuntimeOpinion::Answer::NotInstalled:
    case RuntimeOpinion::Answer::CouldNotAsk: return Agreement::NoOpinion;
    case RuntimeOpinion::Answer::Refused: return gate_selects ? Agreement::Disagrees : Agreement::Agrees;
    case RuntimeOpinion::Answer::Selected:
      return o.selects_nvfp4a16 == gate_selects ? Agreement::Agrees : Agreement::Disagrees;
  }
  return Agreement::NoOpinion;
}

}  // namespace mx2nv
