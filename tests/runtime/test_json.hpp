#pragma once

// A small, strict JSON reader for the runtime tests (the stats endpoint's
// /stats, the access log's JSON lines): objects, arrays, strings (escapes,
// \u as UTF-8), numbers by the JSON grammar, true/false/null; duplicate
// keys and trailing bytes are errors.

#include <cstddef>
#include <cstdlib>
#include <map>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace cadeloop::test {

struct json;
using json_object = std::map<std::string, json>;
using json_array = std::vector<json>;
struct json {
  std::variant<std::nullptr_t, bool, double, std::string, json_array, json_object> v;
  [[nodiscard]] const json& operator[](const std::string& k) const {
    const auto& o = std::get<json_object>(v);
    const auto it = o.find(k);
    if (it == o.end()) {
      throw std::runtime_error("no key " + k);
    }
    return it->second;
  }
  [[nodiscard]] const json& operator[](std::size_t i) const {
    return std::get<json_array>(v).at(i);
  }
  [[nodiscard]] double num() const { return std::get<double>(v); }
  [[nodiscard]] const std::string& str() const { return std::get<std::string>(v); }
  [[nodiscard]] bool boolean() const { return std::get<bool>(v); }
  [[nodiscard]] std::size_t size() const { return std::get<json_array>(v).size(); }
  [[nodiscard]] bool is_null() const { return std::holds_alternative<std::nullptr_t>(v); }
  [[nodiscard]] bool is_object() const { return std::holds_alternative<json_object>(v); }
  /// The member `k` of an object, or nullptr when absent (or not an object).
  [[nodiscard]] const json* get(const std::string& k) const {
    const auto* o = std::get_if<json_object>(&v);
    if (o == nullptr) {
      return nullptr;
    }
    const auto it = o->find(k);
    return it == o->end() ? nullptr : &it->second;
  }
};

class json_parser {
 public:
  explicit json_parser(std::string_view text) : s_(text) {}
  json parse() {
    json j = value();
    ws();
    if (i_ != s_.size()) {
      fail("trailing bytes");
    }
    return j;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error("JSON: " + why + " at " + std::to_string(i_));
  }
  void ws() {
    while (i_ < s_.size() &&
           (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) {
      ++i_;
    }
  }
  bool eat(std::string_view lit) {
    if (s_.substr(i_, lit.size()) == lit) {
      i_ += lit.size();
      return true;
    }
    return false;
  }
  json value() {
    ws();
    if (i_ >= s_.size()) {
      fail("end of input");
    }
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      json_object o;
      ws();
      if (eat("}")) {
        return {o};
      }
      for (;;) {
        ws();
        std::string k = string();
        ws();
        if (!eat(":")) {
          fail("expected :");
        }
        if (o.count(k) != 0) {
          fail("duplicate key " + k);
        }
        o.emplace(std::move(k), value());
        ws();
        if (eat("}")) {
          return {o};
        }
        if (!eat(",")) {
          fail("expected , or }");
        }
      }
    }
    if (c == '[') {
      ++i_;
      json_array a;
      ws();
      if (eat("]")) {
        return {a};
      }
      for (;;) {
        a.push_back(value());
        ws();
        if (eat("]")) {
          return {a};
        }
        if (!eat(",")) {
          fail("expected , or ]");
        }
      }
    }
    if (c == '"') {
      return {string()};
    }
    if (eat("true")) {
      return {true};
    }
    if (eat("false")) {
      return {false};
    }
    if (eat("null")) {
      return {nullptr};
    }
    // Number: JSON grammar, checked strictly (no NaN, no leading +, no hex).
    static const std::regex number{R"(^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?)"};
    std::match_results<std::string_view::const_iterator> m;
    if (!std::regex_search(s_.begin() + static_cast<std::ptrdiff_t>(i_), s_.end(), m, number)) {
      fail("bad value");
    }
    const std::string text = m.str();
    i_ += text.size();
    return {std::strtod(text.c_str(), nullptr)};
  }
  std::string string() {
    if (!eat("\"")) {
      fail("expected string");
    }
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      const char c = s_[i_++];
      if (static_cast<unsigned char>(c) < 0x20) {
        fail("control character in string");
      }
      if (c == '\\') {
        if (i_ >= s_.size()) {
          fail("bad escape");
        }
        const char e = s_[i_++];
        switch (e) {
          case 'n':
            out += '\n';
            break;
          case 't':
            out += '\t';
            break;
          case 'r':
            out += '\r';
            break;
          case '"':
            out += '"';
            break;
          case '\\':
            out += '\\';
            break;
          case '/':
            out += '/';
            break;
          case 'b':
            out += '\b';
            break;
          case 'f':
            out += '\f';
            break;
          case 'u':
            unicode_escape(out);
            break;
          default:
            fail("bad escape");
        }
      } else {
        out += c;
      }
    }
    if (!eat("\"")) {
      fail("unterminated string");
    }
    return out;
  }

  // \uXXXX (BMP only; a surrogate fails) as UTF-8.
  void unicode_escape(std::string& out) {
    if (i_ + 4 > s_.size()) {
      fail("bad \\u escape");
    }
    unsigned cp = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[i_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') {
        cp |= static_cast<unsigned>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        cp |= static_cast<unsigned>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        cp |= static_cast<unsigned>(h - 'A' + 10);
      } else {
        fail("bad \\u escape");
      }
    }
    if (cp >= 0xd800 && cp <= 0xdfff) {
      fail("surrogate in \\u escape");
    }
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

/// `text` as one JSON document, or nullopt when it is not one.
inline std::optional<json> try_parse_json(std::string_view text) {
  try {
    return json_parser{text}.parse();
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace cadeloop::test
