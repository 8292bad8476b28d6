// The ObjectStore conformance suite: one set of tests every backend must pass.
// A backend's test binary links the suite (CMake's wharf_store_conformance) and instantiates it:
//
//   INSTANTIATE_TEST_SUITE_P(Local, ObjectStoreConformance,
//                            testing::Values(ConformanceBackend{"local", MakeFreshStore}),
//                            ConformanceBackendName);
//
// Tests read the store's capabilities() and check what it declares (e.g. a store that
// declares nested_keys_conflict must refuse "a/b" when "a" exists; one that does not must
// accept both).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "store/object_store.h"

namespace wharf {

struct ConformanceBackend {
  std::string name;
  // Returns a fresh, empty store (a new directory, a new bucket) for one test.
  std::function<absl::StatusOr<std::shared_ptr<ObjectStore>>()> make_store;
  // Optional: removes what make_store created (the directory, the bucket and its objects).
  std::function<void(ObjectStore&)> destroy_store;
  // False for a server that ignores the page size a listing asks for (gcp-storage-emulator
  // answers every key in one page): the suite then checks everything but the size of pages.
  // The backend must cover paging another way (canned responses).
  bool server_honours_page_size = true;
  // False for a server that ignores read preconditions and does not say which version it
  // served (the emulator again: no ifGenerationNotMatch, no x-goog-generation on reads), so
  // the store cannot tell a not-modified object from a changed one: the suite then checks that
  // such reads return the object's bytes. Preconditions are covered by canned responses.
  bool server_checks_preconditions = true;
};

inline std::string ConformanceBackendName(const testing::TestParamInfo<ConformanceBackend>& info) {
  return info.param.name;
}

class ObjectStoreConformance : public testing::TestWithParam<ConformanceBackend> {
 protected:
  void SetUp() override;
  void TearDown() override;
  ObjectStore& store() { return *store_; }

  std::shared_ptr<ObjectStore> store_;
};

}  // namespace wharf
