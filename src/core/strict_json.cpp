#include "core/strict_json.hpp"

#include "core/error.hpp"
#include "core/json_stream.hpp"

namespace mx2nv {
namespace {

class StrictBuilder : public nlohmann::json_sax<Json> {
 public:
  explicit StrictBuilder(std::string_view what) : what_(what) {}

  bool null() override { return add(Json(nullptr)); }
  bool boolean(bool v) override { return add(Json(v)); }
  bool number_integer(number_integer_t v) override { return add(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return add(Json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return add(Json(v)); }
  bool string(string_t& v) override { return add(Json(std::move(v))); }
  bool binary(binary_t&) override { fail_input("{}: binary values are not JSON", what_); }

  bool start_object(std::size_t) override { return open(Json::object()); }
  bool start_array(std::size_t) override { return open(Json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }

  bool key(string_t& k) override {
    Json& object = *stack_.back();
    if (object.contains(k)) fail_input("{}: duplicate JSON key \"{}\"", what_, k);
    if (stack_.size() == 1) top_level_keys_.push_back(k);
    pending_key_ = std::move(k);
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) override {
    fail_input("{}: invalid JSON at byte {}: {}", what_, position, ex.what());
  }

  StrictJson result() && { return {std::move(root_), std::move(top_level_keys_)}; }

 private:
  // Inserts a value into the container on top of the stack and returns it.
  Json* place(Json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    Json& slot = top[pending_key_];
    slot = std::move(v);
    return &slot;
  }
  bool add(Json&& v) {
    place(std::move(v));
    return true;
  }
  bool open(Json&& container) {
    if (stack_.size() >= kMaxJsonDepth) fail_input("{}: JSON nested deeper than {} levels", what_, kMaxJsonDepth);
    stack_.push_back(place(std::move(container)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  std::string what_;
  Json root_;
  std::vector<Json*> stack_;
  std::string pending_key_;
  std::vector<std::string> top_level_keys_;
};

}  // namespace

StrictJson parse_strict_json(std::string_view text, std::string_view what) {
  check_json_bytes(text, what);
  StrictBuilder builder(what);
  Json::sax_parse(text.begin(), text.end(), &builder, nlohmann::detail::input_format_t::json, true);
  return std::move(builder).result();
}

}  // namespace mx2nv
