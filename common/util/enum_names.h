// An enum's names as a table of (value, name) pairs, looked up either way:
// for text forms that must stay fixed (database columns, job files).
#pragma once

#include <cstddef>
#include <optional>
#include <utility>

#include "absl/strings/string_view.h"

namespace fusor {

template <typename T>
using EnumName = std::pair<T, absl::string_view>;

// The name of `value`; empty when the table lacks it.
template <typename T, size_t N>
constexpr absl::string_view NameIn(T value, const EnumName<T> (&names)[N]) {
  for (const auto& [v, name] : names) {
    if (v == value) return name;
  }
  return {};
}

// The value named `name`; none when the table lacks it.
template <typename T, size_t N>
constexpr std::optional<T> ValueIn(absl::string_view name, const EnumName<T> (&names)[N]) {
  for (const auto& [v, n] : names) {
    if (n == name) return v;
  }
  return std::nullopt;
}

}  // namespace fusor
