#include "store/metered_store.h"

#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/log.h"
#include "base/profiler.h"

namespace wharf {
namespace internal {

enum Op { kList, kHead, kGet, kPut, kWrite, kDelete, kDeleteMany, kCopy, kCompose, kOps };
constexpr const char* kOpNames[kOps] = {"list",   "head",        "get",  "put",    "write",
                                        "delete", "delete_many", "copy", "compose"};
// out_of_range: a range that starts past the object's end, which a read of an object of
// unknown size may ask for by design (the first GET of an empty one), so not an error.
enum Class { kOk, kNotFound, kPrecondition, kCancelled, kOutOfRange, kError, kClasses };
constexpr const char* kClassNames[kClasses] = {"ok",        "not_found",    "precondition",
                                               "cancelled", "out_of_range", "error"};

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
    case absl::StatusCode::kOutOfRange:
      return kOutOfRange;
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

  // One request from Begin to End. `uri` is kept only when debug logging is on.
  struct Call {
    Op op;
    absl::Time start;
    std::string uri;
    int64_t profile_start_ns = 0;  // set while the profiler runs
  };
  Call Begin(Op op, const ObjectStore& store, absl::string_view key) {
    in_flight[op]->Add(1);
    Call c{op, absl::Now(), "", Profiler::Active() ? MonotonicNanos() : 0};
    if (LogEnabled(LogLevel::kDebug)) c.uri = store.Uri(key);
    return c;
  }
  void End(const Call& c, const absl::Status& status, absl::string_view detail = "") {
    const absl::Duration took = absl::Now() - c.start;
    in_flight[c.op]->Add(-1);
    requests[c.op][ClassOf(status)]->Add();
    seconds[c.op]->Observe(absl::ToDoubleSeconds(took));
    if (c.profile_start_ns != 0 && c.op == kList) {
      Profiler::Get().RecordRequest(ProfileStage::kList, c.profile_start_ns, 0, MonotonicNanos(),
                                    0);
    }
    if (c.uri.empty()) return;
    // One line per request; the status message already names the object and the cause
    // (and an S3 request id), never a secret.
    LogLine(LogLevel::kDebug,
            absl::StrCat(kOpNames[c.op], " ", c.uri, ": ",
                         status.ok() ? "ok"
                                     : absl::StrCat(kClassNames[ClassOf(status)], " (",
                                                    status.message(), ")"),
                         detail.empty() ? "" : ", ", detail, ", ",
                         absl::StrFormat("%.1f ms", absl::ToDoubleMilliseconds(took))));
  }
  void EndGet(const Call& c, const absl::StatusOr<GetResult>& r) {
    if (!r.ok()) return End(c, r.status());
    bytes_read->Add(r->bytes);
    if (c.profile_start_ns != 0) {
      const int64_t end = MonotonicNanos();
      const int64_t ttfb = absl::ToInt64Nanoseconds(r->time_to_first_byte);
      Profiler::Get().RecordRequest(ProfileStage::kFirstByte, c.profile_start_ns,
                                    ttfb > 0 ? c.profile_start_ns + ttfb : end, end, r->bytes);
    }
    if (r->attempts > 1) retries->Add(static_cast<uint64_t>(r->attempts - 1));
    if (r->time_to_first_byte > absl::ZeroDuration()) {
      ttfb->Observe(absl::ToDoubleSeconds(r->time_to_first_byte));
    }
    if (c.uri.empty()) return End(c, r.status());
    End(c, r.status(),
        absl::StrCat(
            r->not_modified ? "not modified" : absl::StrCat(r->bytes, " bytes"), ", attempts ",
            r->attempts, r->request_id.empty() ? "" : absl::StrCat(", request id ", r->request_id),
            ", first byte ",
            absl::StrFormat("%.1f ms", absl::ToDoubleMilliseconds(r->time_to_first_byte))));
  }
};

}  // namespace internal

using internal::StoreMeters;

namespace {

using Call = StoreMeters::Call;

template <typename T>
Callback<T> Metered(std::shared_ptr<StoreMeters> m, Call call, Callback<T> done) {
  return [m = std::move(m), call = std::move(call),
          done = std::move(done)](absl::StatusOr<T> r) mutable {
    m->End(call, r.status());
    std::move(done)(std::move(r));
  };
}

StatusCallback MeteredStatus(std::shared_ptr<StoreMeters> m, Call call, StatusCallback done) {
  return
      [m = std::move(m), call = std::move(call), done = std::move(done)](absl::Status s) mutable {
        m->End(call, s);
        std::move(done)(std::move(s));
      };
}

// A writer's bytes count once it commits; its Close is one "write" request.
class MeteredWriter : public ObjectWriter {
 public:
  MeteredWriter(std::unique_ptr<ObjectWriter> inner, std::shared_ptr<StoreMeters> m, Call call)
      : inner_(std::move(inner)), m_(std::move(m)), call_(std::move(call)) {}
  ~MeteredWriter() override {
    if (!ended_) m_->End(call_, absl::CancelledError("writer dropped"));
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
      if (meta.ok()) m_->bytes_written->Add(bytes_);
      m_->End(call_, meta.status(), absl::StrCat(bytes_, " bytes"));
    }
    return meta;
  }
  void Abort() override {
    inner_->Abort();
    if (!ended_) {
      ended_ = true;
      m_->End(call_, absl::CancelledError("aborted"));
    }
  }

 private:
  std::unique_ptr<ObjectWriter> inner_;
  std::shared_ptr<StoreMeters> m_;
  const Call call_;
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
  Call call = meters_->Begin(internal::kList, *this, options.prefix);
  inner().ListAsync(std::move(options), std::move(continuation),
                    Metered(meters_, std::move(call), std::move(done)));
}

void MeteredStore::HeadAsync(std::string key, Callback<ObjectMeta> done) {
  Call call = meters_->Begin(internal::kHead, *this, key);
  inner().HeadAsync(std::move(key), Metered(meters_, std::move(call), std::move(done)));
}

void MeteredStore::GetAsync(GetRequest request, Callback<GetResult> done) {
  std::shared_ptr<StoreMeters> m = meters_;
  Call call = m->Begin(internal::kGet, *this, request.key);
  inner().GetAsync(std::move(request),
                   [m = std::move(m), call = std::move(call),
                    done = std::move(done)](absl::StatusOr<GetResult> r) mutable {
                     m->EndGet(call, r);
                     std::move(done)(std::move(r));
                   });
}

void MeteredStore::PutAsync(std::string key, absl::Cord data, const PutOptions& options,
                            Callback<ObjectMeta> done) {
  const uint64_t n = data.size();
  std::shared_ptr<StoreMeters> m = meters_;
  Call call = m->Begin(internal::kPut, *this, key);
  inner().PutAsync(std::move(key), std::move(data), options,
                   [m = std::move(m), call = std::move(call), n,
                    done = std::move(done)](absl::StatusOr<ObjectMeta> r) mutable {
                     if (r.ok()) m->bytes_written->Add(n);
                     m->End(call, r.status(), absl::StrCat(n, " bytes"));
                     std::move(done)(std::move(r));
                   });
}

void MeteredStore::DeleteAsync(std::string key, StatusCallback done) {
  Call call = meters_->Begin(internal::kDelete, *this, key);
  inner().DeleteAsync(std::move(key), MeteredStatus(meters_, std::move(call), std::move(done)));
}

void MeteredStore::DeleteManyAsync(std::vector<std::string> keys, StatusCallback done) {
  Call call = meters_->Begin(internal::kDeleteMany, *this, keys.empty() ? "" : keys.front());
  inner().DeleteManyAsync(std::move(keys),
                          MeteredStatus(meters_, std::move(call), std::move(done)));
}

void MeteredStore::CopyAsync(std::string src_key, std::string dst_key, Callback<ObjectMeta> done) {
  Call call = meters_->Begin(internal::kCopy, *this, dst_key);
  inner().CopyAsync(std::move(src_key), std::move(dst_key),
                    Metered(meters_, std::move(call), std::move(done)));
}

const ObjectStore& MeteredStore::Unmetered(const ObjectStore& store) {
  const auto* metered = dynamic_cast<const MeteredStore*>(&store);
  return metered != nullptr ? metered->inner() : store;
}

bool MeteredStore::CanCopyFrom(const ObjectStore& src) const {
  return inner().CanCopyFrom(Unmetered(src));
}

void MeteredStore::CopyFromAsync(const ObjectStore& src, std::string src_key, std::string dst_key,
                                 Callback<ObjectMeta> done) {
  Call call = meters_->Begin(internal::kCopy, *this, dst_key);
  inner().CopyFromAsync(Unmetered(src), std::move(src_key), std::move(dst_key),
                        Metered(meters_, std::move(call), std::move(done)));
}

void MeteredStore::ComposeAsync(std::vector<std::string> sources, std::string dst_key,
                                Callback<ObjectMeta> done) {
  Call call = meters_->Begin(internal::kCompose, *this, dst_key);
  inner().ComposeAsync(std::move(sources), std::move(dst_key),
                       Metered(meters_, std::move(call), std::move(done)));
}

absl::StatusOr<ListPage> MeteredStore::List(const ListOptions& options,
                                            const std::string& continuation) {
  const Call call = meters_->Begin(internal::kList, *this, options.prefix);
  absl::StatusOr<ListPage> r = inner().List(options, continuation);
  meters_->End(call, r.status());
  return r;
}

absl::StatusOr<ObjectMeta> MeteredStore::Head(const std::string& key) {
  const Call call = meters_->Begin(internal::kHead, *this, key);
  absl::StatusOr<ObjectMeta> r = inner().Head(key);
  meters_->End(call, r.status());
  return r;
}

absl::StatusOr<GetResult> MeteredStore::Get(const GetRequest& request) {
  const Call call = meters_->Begin(internal::kGet, *this, request.key);
  absl::StatusOr<GetResult> r = inner().Get(request);
  meters_->EndGet(call, r);
  return r;
}

absl::StatusOr<ObjectMeta> MeteredStore::Put(const std::string& key, absl::Cord data) {
  return Put(key, std::move(data), PutOptions{});
}

absl::StatusOr<ObjectMeta> MeteredStore::Put(const std::string& key, absl::Cord data,
                                             const PutOptions& options) {
  const uint64_t n = data.size();
  const Call call = meters_->Begin(internal::kPut, *this, key);
  absl::StatusOr<ObjectMeta> r = inner().Put(key, std::move(data), options);
  if (r.ok()) meters_->bytes_written->Add(n);
  meters_->End(call, r.status(), absl::StrCat(n, " bytes"));
  return r;
}

absl::Status MeteredStore::Delete(const std::string& key) {
  const Call call = meters_->Begin(internal::kDelete, *this, key);
  absl::Status s = inner().Delete(key);
  meters_->End(call, s);
  return s;
}

absl::Status MeteredStore::DeleteMany(std::vector<std::string> keys) {
  const Call call = meters_->Begin(internal::kDeleteMany, *this, keys.empty() ? "" : keys.front());
  const size_t n = keys.size();
  absl::Status s = inner().DeleteMany(std::move(keys));
  meters_->End(call, s, absl::StrCat(n, " keys"));
  return s;
}

absl::StatusOr<ObjectMeta> MeteredStore::Copy(const std::string& src_key,
                                              const std::string& dst_key) {
  const Call call = meters_->Begin(internal::kCopy, *this, dst_key);
  absl::StatusOr<ObjectMeta> r = inner().Copy(src_key, dst_key);
  meters_->End(call, r.status());
  return r;
}

absl::StatusOr<std::unique_ptr<ObjectWriter>> MeteredStore::NewWriter(std::string key,
                                                                      const PutOptions& options) {
  Call call = meters_->Begin(internal::kWrite, *this, key);
  absl::StatusOr<std::unique_ptr<ObjectWriter>> w = inner().NewWriter(std::move(key), options);
  if (!w.ok()) {
    meters_->End(call, w.status());
    return w;
  }
  return std::unique_ptr<ObjectWriter>(new MeteredWriter(*std::move(w), meters_, std::move(call)));
}

}  // namespace wharf
