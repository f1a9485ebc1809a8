#pragma once
// The names users write for an enum's values ("naive", "cpu"): one table per
// enum parses, prints and lists them, so that each name is spelled once.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hdp {

template <class E>
struct EnumName {
  E value;
  const char* name;
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

template <class E, size_t N>
std::vector<std::string> enum_names(const EnumName<E> (&table)[N]) {
  std::vector<std::string> names;
  for (const EnumName<E>& entry : table) names.push_back(entry.name);
  return names;
}

}  // namespace hdp
