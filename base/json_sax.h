// A SAX handler of nlohmann::json that accepts every event and stops at a syntax error: derive
// from it and override only the events a pass needs (the parser's error message without an
// exception, the keys of a document). A SAX pass builds nothing, so it is linear in the text
// whatever the document's shape.
#pragma once

#include <cstddef>
#include <string>

#include "nlohmann/json.hpp"

namespace wharf {

class JsonSaxBase : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
};

}  // namespace wharf
