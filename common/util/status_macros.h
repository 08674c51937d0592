// RETURN_IF_ERROR / ASSIGN_OR_RETURN for absl::Status and absl::StatusOr.
// The system Abseil (20220623) does not ship them.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define FUSOR_CONCAT_INNER(a, b) a##b
#define FUSOR_CONCAT(a, b) FUSOR_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                       \
  do {                                              \
    ::absl::Status fusor_status_ = (expr);          \
    if (!fusor_status_.ok()) return fusor_status_;  \
  } while (0)

#define FUSOR_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(*tmp)

#define ASSIGN_OR_RETURN(lhs, expr) \
  FUSOR_ASSIGN_OR_RETURN_IMPL(FUSOR_CONCAT(fusor_statusor_, __LINE__), lhs, expr)
