// absl::Status plumbing used across flashdraft: early-return macros in the style of Abseil's
// internal ones (not shipped in Debian's Abseil 20220623).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define FD_STATUS_CONCAT_INNER_(a, b) a##b
#define FD_STATUS_CONCAT_(a, b) FD_STATUS_CONCAT_INNER_(a, b)

// Returns from the current function if `expr` yields a non-OK absl::Status.
#define FD_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status fd_status_ = (expr);      \
    if (!fd_status_.ok()) return fd_status_; \
  } while (0)

// `FD_ASSIGN_OR_RETURN(auto x, MakeX());` — assigns the value of an absl::StatusOr or returns its
// error.
#define FD_ASSIGN_OR_RETURN(lhs, expr) \
  FD_ASSIGN_OR_RETURN_IMPL_(FD_STATUS_CONCAT_(fd_statusor_, __LINE__), lhs, expr)
#define FD_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr)     \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()
