// Test helper: a LocalStore (file://) in a fresh temporary directory, removed afterwards.
// Thread-safety: as LocalStore.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "base/runtime.h"
#include "gtest/gtest.h"
#include "store/local/local_store.h"

namespace wharf::store_testing {

class TempStore {
 public:
  TempStore() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "wharf-test-XXXXXX").string();
    EXPECT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    auto store = LocalStore::Open(root_, Runtime::Default());
    EXPECT_TRUE(store.ok()) << store.status();
    store_ = std::shared_ptr<LocalStore>(*std::move(store));
  }
  ~TempStore() {
    store_.reset();
    std::filesystem::remove_all(root_);
  }
  TempStore(const TempStore&) = delete;
  TempStore& operator=(const TempStore&) = delete;

  const std::shared_ptr<LocalStore>& store() const { return store_; }
  const std::string& root() const { return root_; }
  // The file backing `key`.
  std::string PathOf(const std::string& key) const { return root_ + "/" + key; }

 private:
  std::string root_;
  std::shared_ptr<LocalStore> store_;
};

}  // namespace wharf::store_testing
