// Template definitions for object_store.h. Not for direct inclusion.
#pragma once

#include <optional>
#include <utility>

#include "absl/synchronization/notification.h"
#include "base/cancel.h"

namespace wharf {

template <typename T, typename Start>
absl::StatusOr<T> WaitFor(Start&& start) {
  absl::Notification done;
  std::optional<absl::StatusOr<T>> result;
  std::forward<Start>(start)([&](absl::StatusOr<T> r) {
    result.emplace(std::move(r));
    done.Notify();
  });
  WaitInterruptibly(done);  // base/cancel.h
  return std::move(*result);
}

}  // namespace wharf
