// Minimal JSON writing for the benchmark runtime's line protocol (no third-party dependency).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

namespace benanza {

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

inline std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";  // JSON has no NaN/Inf
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

// Builds one JSON object; values are appended in call order, keys are not checked for duplicates.
class JsonObject {
 public:
  JsonObject& add(const std::string& key, const std::string& value) { return raw(key, json_string(value)); }
  JsonObject& add(const std::string& key, const char* value) { return raw(key, json_string(value)); }
  JsonObject& add(const std::string& key, double value) { return raw(key, json_number(value)); }
  JsonObject& add(const std::string& key, int64_t value) { return raw(key, std::to_string(value)); }
  JsonObject& add(const std::string& key, bool value) { return raw(key, value ? "true" : "false"); }
  JsonObject& add(const std::string& key, const std::map<std::string, std::string>& m) {
    JsonObject o;
    for (const auto& kv : m) o.add(kv.first, kv.second);
    return raw(key, o.str());
  }
  JsonObject& raw(const std::string& key, const std::string& json) {
    body_ += (body_.empty() ? "" : ",") + json_string(key) + ":" + json;
    return *this;
  }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

}  // namespace benanza
