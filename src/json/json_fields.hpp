// Reading a parsed JSON document (parse_strict_json) field by field, by name
// and expected type: the reading half of JsonOut (json_writer.hpp). Every
// error is Error(InvalidInput) naming the document (`what`, its file) and
// the path of the value, e.g.
//   plan.json: "shards[3].plan_hash" must be an unsigned integer, not a string
// A document is input: arrays are refused past the caller's cap before
// anything is allocated for their items, and numbers outside the expected
// type's range are refused rather than converted.
#pragma once

#include "common/error.hpp"
#include "json/strict_json.hpp"

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace mx2nv {

class JsonFields;

// One value of a document and where it is.
class JsonValue {
 public:
  JsonValue(const Json& value, std::string_view what, std::string path)
      : value_(&value), what_(what), path_(std::move(path)) {}

  const Json& json() const { return *value_; }
  const std::string& path() const { return path_; }
  bool is_null() const { return value_->is_null(); }

  std::uint64_t as_uint() const;
  std::int64_t as_int() const;
  // An integer in [lo, hi].
  std::int64_t as_int_in(std::int64_t lo, std::int64_t hi) const;
  double as_number() const;  // any JSON number (finite: the parser yields no other)
  bool as_bool() const;
  const std::string& as_string() const;
  // A string of at most `max_bytes` bytes.
  const std::string& as_string(std::size_t max_bytes) const;
  JsonFields as_object() const;
  // An array of at most `max_items` items (refused, naming the cap, before
  // the caller allocates for them).
  std::size_t array_size(std::size_t max_items) const;
  JsonValue item(std::size_t i) const;

  // Error(InvalidInput) "<what>: \"<path>\" <message>", the message a
  // predicate ("is missing", "must be a string, not null"); the path is
  // quoted (a hostile key may hold dots, spaces or colons). At the root:
  // "<what>: the document <message>".
  template <typename... Args>
  [[noreturn]] void bad(fmt::format_string<Args...> format, Args&&... args) const {
    fail_bad(fmt::format(format, std::forward<Args>(args)...));
  }

 private:
  [[noreturn]] void fail_bad(const std::string& message) const;
  [[noreturn]] void expected(std::string_view type) const;
  const Json* value_;
  std::string_view what_;
  std::string path_;
};

// The JSON type of `v` in words ("a string", "null", ...), for messages.
std::string_view json_type_words(const Json& v);

// One object of a document, read by key.
class JsonFields {
 public:
  // Throws (naming `path`) unless `object` is a JSON object.
  JsonFields(const Json& object, std::string_view what, std::string path = "");

  bool has(std::string_view key) const { return object_->contains(key); }
  // The value of `key`; "\"<path.key>\" is missing" when absent.
  JsonValue required(std::string_view key) const;
  std::optional<JsonValue> optional(std::string_view key) const;
  // Where `key` is (present or not), for messages about it.
  JsonValue at_key(std::string_view key) const { return JsonValue(*object_, what_, key_path(key)); }

  // Shorthands for required fields of one type.
  std::uint64_t uint(std::string_view key) const { return required(key).as_uint(); }
  std::int64_t int64(std::string_view key) const { return required(key).as_int(); }
  double number(std::string_view key) const { return required(key).as_number(); }
  bool boolean(std::string_view key) const { return required(key).as_bool(); }
  const std::string& string(std::string_view key) const { return required(key).as_string(); }
  JsonFields object(std::string_view key) const { return required(key).as_object(); }
  // null -> nullopt, else an unsigned integer.
  std::optional<std::uint64_t> uint_or_null(std::string_view key) const;

  // Refuses a key not among `known` ("\"<path.key>\" is not a key of <kind>").
  void only(std::initializer_list<std::string_view> known, std::string_view kind) const;

  const std::string& path() const { return path_; }
  JsonValue self() const { return JsonValue(*object_, what_, path_); }

 private:
  std::string key_path(std::string_view key) const;
  const Json* object_;
  std::string_view what_;
  std::string path_;
};

}  // namespace mx2nv
