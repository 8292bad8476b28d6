#include "store/metered_store.h"

#include <array>
#include <utility>

#include "absl/time/clock.h"

namespace wharf {
namespace internal {

enum Op { kList, kHead, kGet, kPut, kWrite, kDelete, kDeleteMany, kCopy, kCompose, kOps };
constexpr const char* kOpNames[kOps] = {"list",   "head",        "get",  "put",    "write",
                                        "delete", "delete_many", "copy", "compose"};
enum Class { kOk, kNotFound, kPrecondition, kCancelled, kError, kClasses };
constexpr const char* kClassNames[kClasses] = {"ok", "not_found", "precondition", "cancelled",
                                               "error"};

Class ClassOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return kOk;
    case absl::StatusCode::kNotFound:
      return kNotFound;
    case absl::StatusCode::kFailedPrecondition:
      return kPrecondition;
    case absl::StatusCode::kCancelled:
      return kCancelled;
    default:
      return kError;
  }
}

// Request latencies span a page-cache read (tens of us) to a slow remote write: 50 us .. ~105 s.
std::vector<double> RequestBounds() {
  std::vector<double> b;
  for (double v = 50e-6; v < 110; v *= 2) b.push_back(v);
  return b;
}

struct StoreMeters {
  std::shared_ptr<Runtime> runtime;  // owns the registry the pointers below live in
  std::array<std::array<Counter*, kClasses>, kOps> requests{};
  std::array<Histogram*, kOps> seconds{};
  std::array<Gauge*, kOps> in_flight{};
  Histogram* ttfb = nullptr;
  Counter* retries = nullptr;
  Counter* bytes_read = nullptr;
  Counter* bytes_written = nullptr;

  StoreMeters(std::shared_ptr<Runtime> rt, const std::string& scheme) : runtime(std::move(rt)) {
    MetricsRegistry& m = runtime->metrics();
    for (int op = 0; op < kOps; ++op) {
      for (int c = 0; c < kClasses; ++c) {
        requests[op][c] = m.GetCounter(
            "wharf_store_requests_total", "Requests to object stores, by operation and outcome",
            {{"scheme", scheme}, {"op", kOpNames[op]}, {"status", kClassNames[c]}});
      }
      seconds[op] = m.GetHistogram("wharf_store_request_seconds",
                                   "Time from issuing a store request to its completion",
                                   RequestBounds(), {{"scheme", scheme}, {"op", kOpNames[op]}});
      in_flight[op] = m.GetGauge("wharf_store_requests_in_flight", "Store requests outstanding",
                                 {{"scheme", scheme}, {"op", kOpNames[op]}});
    }
    ttfb = m.GetHistogram("wharf_store_time_to_first_byte_seconds",
                          "Time from sending a GET to its first response byte", RequestBounds(),
                          {{"scheme", scheme}});
    retries = m.GetCounter("wharf_store_retries_total",
                           "GET attempts beyond the first (the store's own retries)",
                           {{"scheme", scheme}});
    bytes_read = m.GetCounter("wharf_store_read_bytes_total", "Bytes delivered by store reads",
                              {{"scheme", scheme}});
    bytes_written = m.GetCounter("wharf_store_written_bytes_total",
                                 "Bytes written to stores (puts and writers that committed)",
                                 {{"scheme", scheme}});
  }

  // One request from Begin to End.
  absl::Time Begin(Op op) {
    in_flight[op]->Add(1);
    return absl::Now();
  }
  void End(Op op, absl::Time start, const absl::Status& status) {
    in_flight[op]->Add(-1);
    requests[op][ClassOf(status)]->Add();
    seconds[op]->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
  void EndGet(absl::Time start, const absl::StatusOr<GetResult>& r) {
    End(kGet, start, r.status());
    if (!r.ok()) return;
    bytes_read->Add(r->bytes);
    if (r->attempts > 1) retries->Add(static_cast<uint64_t>(r->attempts - 1));
    if (r->time_to_first_byte > absl::ZeroDuration()) {
      ttfb->Observe(absl::ToDoubleSeconds(r->time_to_first_byte));
    }
  }
};

}  // namespace internal

using internal::StoreMeters;

namespace {

template <typename T>
Callback<T> Metered(std::shared_ptr<StoreMeters> m, internal::Op op, Callback<T> done) {
  const absl::Time start = m->Begin(op);
  return [m = std::move(m), op, start, done = std::move(done)](absl::StatusOr<T> r) mutable {
    m->End(op, start, r.status());
    std::move(done)(std::move(r));
  };
}

StatusCallback MeteredStatus(std::shared_ptr<StoreMeters> m, internal::Op op, StatusCallback done) {
  const absl::Time start = m->Begin(op);
  return [m = std::move(m), op, start, done = std::move(done)](absl::Status s) mutable {
    m->End(op, start, s);
    std::move(done)(std::move(s));
  };
}

// A writer's bytes count once it commits; its Close is one "write" request.
class MeteredWriter : public ObjectWriter {
 public:
  MeteredWriter(std::unique_ptr<ObjectWriter> inner, std::shared_ptr<StoreMeters> m)
      : inner_(std::move(inner)), m_(std::move(m)), start_(m_->Begin(internal::kWrite)) {}
  ~MeteredWriter() override {
    if (!ended_) m_->End(internal::kWrite, start_, absl::CancelledError("writer dropped"));
  }
  absl::Status Write(absl::Cord data) override {
    const size_t n = data.size();
    absl::Status s = inner_->Write(std::move(data));
    if (s.ok()) bytes_ += n;
    return s;
  }
  absl::StatusOr<ObjectMeta> Close() override {
    absl::StatusOr<ObjectMeta> meta = inner_->Close();
    if (!ended_) {
      ended_ = true;
      m_->End(internal::kWrite, start_, meta.status());
      if (meta.ok()) m_->bytes_written->Add(bytes_);
    }
    return meta;
  }
  void Abort() override {
    inner_->Abort();
    if (!ended_) {
      ended_ = true;
      m_->End(internal::kWrite, start_, absl::CancelledError("aborted"));
    }
  }

 private:
  std::unique_ptr<ObjectWriter> inner_;
  std::shared_ptr<StoreMeters> m_;
  const absl::Time start_;
  uint64_t bytes_ = 0;
  bool ended_ = false;
};

}  // namespace

MeteredStore::MeteredStore(std::shared_ptr<ObjectStore> inner, const std::string& scheme,
                           std::shared_ptr<Runtime> runtime)
    : ForwardingStore(std::move(inner)),
      meters_(std::make_shared<StoreMeters>(std::move(runtime), scheme)) {}

MeteredStore::~MeteredStore() = default;

void MeteredStore::ListAsync(ListOptions options, std::string continuation,
                             Callback<ListPage> done) {
  inner().ListAsync(std::move(options), std::move(continuation),
                    Metered(meters_, internal::kList, std::move(done)));
}

void MeteredStore::HeadAsync(std::string key, Callback<ObjectMeta> done) {
  inner().HeadAsync(std::move(key), Metered(meters_, internal::kHead, std::move(done)));
}

void MeteredStore::GetAsync(GetRequest request, Callback<GetResult> done) {
  std::shared_ptr<StoreMeters> m = meters_;
  const absl::Time start = m->Begin(internal::kGet);
  inner().GetAsync(std::move(request), [m = std::move(m), start, done = std::move(done)](
                                           absl::StatusOr<GetResult> r) mutable {
    m->EndGet(start, r);
    std::move(done)(std::move(r));
  });
}

void MeteredStore::PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                            Callback<ObjectMeta> done) {
  const uint64_t n = data.size();
  std::shared_ptr<StoreMeters> m = meters_;
  inner().PutAsync(
      std::move(key), std::move(data), options,
      Metered<ObjectMeta>(m, internal::kPut,
                          [m, n, done = std::move(done)](absl::StatusOr<ObjectMeta> r) mutable {
                            if (r.ok()) m->bytes_written->Add(n);
                            std::move(done)(std::move(r));
                          }));
}

void MeteredStore::DeleteAsync(std::string key, StatusCallback done) {
  inner().DeleteAsync(std::move(key), MeteredStatus(meters_, internal::kDelete, std::move(done)));
}

void MeteredStore::DeleteManyAsync(std::vector<std::string> keys, StatusCallback done) {
  inner().DeleteManyAsync(std::move(keys),
                          MeteredStatus(meters_, internal::kDeleteMany, std::move(done)));
}

void MeteredStore::CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) {
  inner().CopyAsync(std::move(src_key), std::move(dst_key),
                    Metered(meters_, internal::kCopy, std::move(done)));
}

void MeteredStore::ComposeAsync(std::vector<std::string> sources, std::string dst_key,
                                Callback<ObjectMeta> done) {
  inner().ComposeAsync(std::move(sources), std::move(dst_key),
                       Metered(meters_, internal::kCompose, std::move(done)));
}

absl::StatusOr<ListPage> MeteredStore::List(const ListOptions& options,
                                            const std::string& continuation) {
  const absl::Time start = meters_->Begin(internal::kList);
  absl::StatusOr<ListPage> r = inner().List(options, continuation);
  meters_->End(internal::kList, start, r.status());
  return r;
}

absl::StatusOr<ObjectMeta> MeteredStore::Head(const std::string& key) {
  const absl::Time start = meters_->Begin(internal::kHead);
  absl::StatusOr<ObjectMeta> r = inner().Head(key);
  meters_->End(internal::kHead, start, r.status());
  return r;
}

absl::StatusOr<GetResult> MeteredStore::Get(const GetRequest& request) {
  const absl::Time start = meters_->Begin(internal::kGet);
  absl::StatusOr<GetResult> r = inner().Get(request);
  meters_->EndGet(start, r);
  return r;
}

absl::StatusOr<ObjectMeta> MeteredStore::Put(const std::string& key, absl::Cord data) {
  return Put(key, std::move(data), PutOptions{});
}

absl::StatusOr<ObjectMeta> MeteredStore::Put(const std::string& key, absl::Cord data,
                                             const PutOptions& options) {
  const uint64_t n = data.size();
  const absl::Time start = meters_->Begin(internal::kPut);
  absl::StatusOr<ObjectMeta> r = inner().Put(key, std::move(data), options);
  meters_->End(internal::kPut, start, r.status());
  if (r.ok()) meters_->bytes_written->Add(n);
  return r;
}

absl::Status MeteredStore::Delete(const std::string& key) {
  const absl::Time start = meters_->Begin(internal::kDelete);
  absl::Status s = inner().Delete(key);
  meters_->End(internal::kDelete, start, s);
  return s;
}

absl::Status MeteredStore::DeleteMany(std::vector<std::string> keys) {
  const absl::Time start = meters_->Begin(internal::kDeleteMany);
  absl::Status s = inner().DeleteMany(std::move(keys));
  meters_->End(internal::kDeleteMany, start, s);
  return s;
}

absl::StatusOr<ObjectMeta> MeteredStore::Copy(const std::string& src_key,
                                              const std::string& dst_key) {
  const absl::Time start = meters_->Begin(internal::kCopy);
  absl::StatusOr<ObjectMeta> r = inner().Copy(src_key, dst_key);
  meters_->End(internal::kCopy, start, r.status());
  return r;
}

absl::StatusOr<std::unique_ptr<ObjectWriter>> MeteredStore::NewWriter(std::string key,
                                                                      const PutOptions& options) {
  absl::StatusOr<std::unique_ptr<ObjectWriter>> w = inner().NewWriter(std::move(key), options);
  if (!w.ok()) return w;
  return std::unique_ptr<ObjectWriter>(new MeteredWriter(*std::move(w), meters_));
}

}  // namespace wharf
