#include "json/strict_json.hpp"

#include "common/error.hpp"
#include "common/printable.hpp"
#include "json/json_stream.hpp"

namespace mx2nv {
namespace {

class StrictBuilder : public nlohmann::json_sax<Json> {
 public:
  StrictBuilder(std::string_view what, std::size_t max_values) : what_(what), max_values_(max_values) {}

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
    if (tree_.depth() == 1) top_level_keys_.push_back(k);
    if (!tree_.key(k)) fail_input("{}: duplicate JSON key \"{}\"", what_, excerpt(k));
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) override {
    fail_input("{}: invalid JSON at byte {}: {}", what_, position, excerpt(ex.what(), 512));
  }

  StrictJson result() && { return {std::move(root_), std::move(top_level_keys_)}; }

 private:
  void count() {
    if (++values_ > max_values_) fail_input("{}: more than {} JSON values", what_, max_values_);
  }
  bool add(Json&& v) {
    count();
    tree_.place(std::move(v));
    return true;
  }
  bool open(Json&& container) {
    if (tree_.depth() >= kMaxJsonDepth) fail_input("{}: JSON nested deeper than {} levels", what_, kMaxJsonDepth);
    count();
    tree_.open(std::move(container));
    return true;
  }
  bool close() {
    tree_.close();
    return true;
  }

  std::string what_;
  std::size_t max_values_;
  std::size_t values_ = 0;
  Json root_;
  JsonTree tree_{root_};
  std::vector<std::string> top_level_keys_;
};

}  // namespace

Json* JsonTree::place(Json&& v) {
  if (stack_.empty()) {
    *root_ = std::move(v);
    return root_;
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

bool JsonTree::key(std::string& k) {
  if (stack_.back()->contains(k)) return false;
  pending_key_ = std::move(k);
  return true;
}

StrictJson parse_strict_json(std::string_view text, std::string_view what, std::size_t max_values) {
  check_json_bytes(text, what);
  StrictBuilder builder(what, max_values);
  Json::sax_parse(text.begin(), text.end(), &builder, nlohmann::detail::input_format_t::json, true);
  return std::move(builder).result();
}

const Json& member_or_null(const Json& v, std::string_view key) {
  static const Json kNull;
  if (!v.is_object()) return kNull;
  const auto it = v.find(key);
  return it == v.end() ? kNull : *it;
}

}  // namespace mx2nv
