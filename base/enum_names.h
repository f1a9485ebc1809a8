#pragma once
// The names users write for an enum's values ("naive", "cpu"): one table per
// enum parses them, prints them and lists the choices in messages, so that each
// name is spelled once.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace hdp {

template <class E>
struct EnumName {
  E value;
  const char* name;
  const char* meaning = "";  // said after the name when listing the choices; empty: the name says it
};

// The name of `value`; "?" only for a value the table lacks.
template <class E, size_t N>
constexpr const char* enum_name(const EnumName<E> (&table)[N], E value) {
  for (const EnumName<E>& entry : table)
    if (entry.value == value) return entry.name;
  return "?";
}

// The value named `name`, if the table has it.
template <class E, size_t N>
std::optional<E> enum_value(const EnumName<E> (&table)[N], std::string_view name) {
  for (const EnumName<E>& entry : table)
    if (name == entry.name) return entry.value;
  return std::nullopt;
}

// The choices for a message, in table order: "auto (the newest checkpoint) or never".
template <class E, size_t N>
std::string enum_choices(const EnumName<E> (&table)[N]) {
  std::string text;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) text += i + 1 < N ? ", " : " or ";
    text += table[i].name;
    if (*table[i].meaning) text += std::string(" (") + table[i].meaning + ")";
  }
  return text;
}

}  // namespace hdp
