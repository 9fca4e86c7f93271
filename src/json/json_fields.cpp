#include "json/json_fields.hpp"

#include <algorithm>
#include <limits>

namespace mx2nv {
namespace {

// At most this much of a hostile key is quoted in a path.
constexpr std::size_t kQuotedKeyBytes = 80;

std::string quoted_key(std::string_view key) {
  if (key.size() <= kQuotedKeyBytes) return std::string(key);
  return std::string(key.substr(0, kQuotedKeyBytes)) + "...";
}

}  // namespace

std::string_view json_type_words(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "an integer";
    case Json::value_t::number_float: return "a number with a fraction or exponent";
    case Json::value_t::string: return "a string";
    case Json::value_t::array: return "an array";
    case Json::value_t::object: return "an object";
    default: return "not JSON";
  }
}

void JsonValue::fail_bad(const std::string& message) const {
  if (path_.empty()) fail_input("{}: the document {}", what_, message);
  fail_input("{}: \"{}\" {}", what_, path_, message);
}

void JsonValue::expected(std::string_view type) const {
  fail_bad(fmt::format("must be {}, not {}", type, json_type_words(*value_)));
}

std::uint64_t JsonValue::as_uint() const {
  if (value_->is_number_unsigned()) return value_->get<std::uint64_t>();
  // nlohmann reads "-0" as a signed 0.
  if (value_->is_number_integer() && value_->get<std::int64_t>() == 0) return 0;
  if (value_->is_number_integer()) bad("must be an unsigned integer, not {}", value_->get<std::int64_t>());
  expected("an unsigned integer");
}

std::int64_t JsonValue::as_int() const {
  // nlohmann's is_number_integer() holds for unsigned numbers too: those first.
  if (value_->is_number_unsigned()) {
    const auto u = value_->get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) bad("is {}, out of range", u);
    return static_cast<std::int64_t>(u);
  }
  if (value_->is_number_integer()) return value_->get<std::int64_t>();
  expected("an integer");
}

std::int64_t JsonValue::as_int_in(std::int64_t lo, std::int64_t hi) const {
  const std::int64_t v = as_int();
  if (v < lo || v > hi) bad("is {}, outside [{}, {}]", v, lo, hi);
  return v;
}

double JsonValue::as_number() const {
  if (!value_->is_number()) expected("a number");
  return value_->get<double>();
}

bool JsonValue::as_bool() const {
  if (!value_->is_boolean()) expected("true or false");
  return value_->get<bool>();
}

const std::string& JsonValue::as_string() const {
  if (!value_->is_string()) expected("a string");
  return value_->get_ref<const std::string&>();
}

const std::string& JsonValue::as_string(std::size_t max_bytes) const {
  const std::string& s = as_string();
  if (s.size() > max_bytes) bad("is a string of {} bytes, more than {}", s.size(), max_bytes);
  return s;
}

JsonFields JsonValue::as_object() const { return JsonFields(*value_, what_, path_); }

std::size_t JsonValue::array_size(std::size_t max_items) const {
  if (!value_->is_array()) expected("an array");
  if (value_->size() > max_items) bad("has {} items, more than {}", value_->size(), max_items);
  return value_->size();
}

JsonValue JsonValue::item(std::size_t i) const {
  return JsonValue((*value_)[i], what_, fmt::format("{}[{}]", path_, i));
}

JsonFields::JsonFields(const Json& object, std::string_view what, std::string path)
    : object_(&object), what_(what), path_(std::move(path)) {
  if (!object.is_object()) {
    JsonValue(object, what, path_).bad("must be an object, not {}", json_type_words(object));
  }
}

std::string JsonFields::key_path(std::string_view key) const {
  return path_.empty() ? quoted_key(key) : fmt::format("{}.{}", path_, quoted_key(key));
}

JsonValue JsonFields::required(std::string_view key) const {
  const auto it = object_->find(key);
  if (it == object_->end()) JsonValue(*object_, what_, key_path(key)).bad("is missing");
  return JsonValue(*it, what_, key_path(key));
}

std::optional<JsonValue> JsonFields::optional(std::string_view key) const {
  const auto it = object_->find(key);
  if (it == object_->end()) return std::nullopt;
  return JsonValue(*it, what_, key_path(key));
}

std::optional<std::uint64_t> JsonFields::uint_or_null(std::string_view key) const {
  const JsonValue v = required(key);
  if (v.is_null()) return std::nullopt;
  return v.as_uint();
}

void JsonFields::only(std::initializer_list<std::string_view> known, std::string_view kind) const {
  for (auto it = object_->begin(); it != object_->end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) == known.end()) {
      JsonValue(*it, what_, key_path(it.key())).bad("is not a key of {}", kind);
    }
  }
}

}  // namespace mx2nv
