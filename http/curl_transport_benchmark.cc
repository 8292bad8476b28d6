// Client CPU per small GET: the curl transport against a bare libcurl multi loop doing the
// same exchanges, both against the in-process test server over loopback. The difference is
// what the transport adds on top of curl (queueing, slot recycling, header parsing, body
// routing, the response and callback objects).
//
// Usage: curl_transport_benchmark [requests=20000] [window=64] [body_bytes=100] [json_path]
// Prints a table; writes JSON to json_path (default curl_transport_benchmark.json).
#include <curl/curl.h>
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "http/curl_transport.h"
#include "http/test_http_server.h"
#include "nlohmann/json.hpp"

namespace wharf {
namespace {

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Result {
  double cpu_us_per_request = 0;
  double requests_per_second = 0;
  int failures = 0;
};

// All sends and completions happen on the loop thread once primed (each `done` sends the
// next request), so the loop thread's CPU time is the transport's whole client cost.
Result RunTransport(const std::string& url, int requests, int window) {
  CurlTransportOptions options;
  options.max_connections = window;
  options.max_in_flight = window;
  std::unique_ptr<HttpTransport> transport = NewCurlTransport(options);
  const int warmup = std::min(requests / 10, 2000);
  int sent = 0;
  int completed = 0;
  Result result;
  double cpu_start = 0;
  absl::Time wall_start;
  absl::Notification finished;
  std::function<void()> send_one;
  send_one = [&] {
    ++sent;
    HttpRequest request;
    request.url = url;
    transport->Send(std::move(request), [&](absl::StatusOr<HttpResponse> response) {
      if (!response.ok() || response->status != 200) ++result.failures;
      if (++completed == warmup) {
        cpu_start = ThreadCpuSeconds();
        wall_start = absl::Now();
      }
      if (completed == requests) {
        double cpu = ThreadCpuSeconds() - cpu_start;
        double wall = absl::ToDoubleSeconds(absl::Now() - wall_start);
        result.cpu_us_per_request = cpu * 1e6 / (requests - warmup);
        result.requests_per_second = (requests - warmup) / wall;
        finished.Notify();
        return;
      }
      if (sent < requests) send_one();
    });
  };
  for (int i = 0; i < window && sent < requests; ++i) send_one();
  finished.WaitForNotification();
  return result;
}

size_t Discard(char*, size_t size, size_t count, void* body) {
  static_cast<std::string*>(body)->append(size * count, '\0');
  return size * count;
}
size_t IgnoreHeader(char*, size_t size, size_t count, void*) { return size * count; }

// The floor: one thread, one multi handle, `window` easy handles re-added as they finish.
Result RunBareCurl(const std::string& url, int requests, int window) {
  CURLM* multi = curl_multi_init();
  curl_multi_setopt(multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, static_cast<long>(window));
  curl_multi_setopt(multi, CURLMOPT_MAXCONNECTS, static_cast<long>(window));
  std::vector<CURL*> easies;
  std::vector<std::string> bodies(window);
  for (int i = 0; i < window; ++i) {
    CURL* easy = curl_easy_init();
    curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(easy, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &Discard);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, &bodies[i]);
    curl_easy_setopt(easy, CURLOPT_HEADERFUNCTION, &IgnoreHeader);
    curl_easy_setopt(easy, CURLOPT_PRIVATE, &bodies[i]);
    easies.push_back(easy);
  }
  const int warmup = std::min(requests / 10, 2000);
  int sent = 0;
  int completed = 0;
  Result result;
  double cpu_start = ThreadCpuSeconds();
  absl::Time wall_start = absl::Now();
  for (int i = 0; i < window && sent < requests; ++i, ++sent) {
    curl_multi_add_handle(multi, easies[i]);
  }
  while (completed < requests) {
    int running = 0;
    curl_multi_perform(multi, &running);
    int left = 0;
    while (CURLMsg* message = curl_multi_info_read(multi, &left)) {
      if (message->msg != CURLMSG_DONE) continue;
      CURL* easy = message->easy_handle;
      if (message->data.result != CURLE_OK) ++result.failures;
      curl_multi_remove_handle(multi, easy);
      if (++completed == warmup) {
        cpu_start = ThreadCpuSeconds();
        wall_start = absl::Now();
      }
      if (sent < requests) {
        char* body = nullptr;
        curl_easy_getinfo(easy, CURLINFO_PRIVATE, &body);
        reinterpret_cast<std::string*>(body)->clear();
        curl_multi_add_handle(multi, easy);
        ++sent;
      }
    }
    if (completed < requests) curl_multi_poll(multi, nullptr, 0, 1000, nullptr);
  }
  double cpu = ThreadCpuSeconds() - cpu_start;
  double wall = absl::ToDoubleSeconds(absl::Now() - wall_start);
  result.cpu_us_per_request = cpu * 1e6 / (requests - warmup);
  result.requests_per_second = (requests - warmup) / wall;
  for (CURL* easy : easies) curl_easy_cleanup(easy);
  curl_multi_cleanup(multi);
  return result;
}

int Main(int argc, char** argv) {
  const int requests = argc > 1 ? std::atoi(argv[1]) : 20000;
  const int window = argc > 2 ? std::atoi(argv[2]) : 64;
  const int body_bytes = argc > 3 ? std::atoi(argv[3]) : 100;
  const std::string json_path = argc > 4 ? argv[4] : "curl_transport_benchmark.json";
  http_testing::TestHttpServer server;
  const std::string url = server.Url(absl::StrCat("/bytes/", body_bytes));

  // Curl first so that its global init and the server's threads are warm for both runs.
  Result bare = RunBareCurl(url, requests, window);
  Result wharf = RunTransport(url, requests, window);
  Result bare2 = RunBareCurl(url, requests, window);
  Result wharf2 = RunTransport(url, requests, window);
  double bare_us = std::min(bare.cpu_us_per_request, bare2.cpu_us_per_request);
  double wharf_us = std::min(wharf.cpu_us_per_request, wharf2.cpu_us_per_request);

  std::printf("%-22s %14s %12s %9s\n", "client", "cpu us/request", "requests/s", "failures");
  std::printf("%-22s %14.1f %12.0f %9d\n", "bare libcurl multi", bare_us,
              std::max(bare.requests_per_second, bare2.requests_per_second),
              bare.failures + bare2.failures);
  std::printf("%-22s %14.1f %12.0f %9d\n", "wharf curl transport", wharf_us,
              std::max(wharf.requests_per_second, wharf2.requests_per_second),
              wharf.failures + wharf2.failures);
  std::printf("transport overhead: %.1f us/request (%d requests of %d bytes, window %d)\n",
              wharf_us - bare_us, requests, body_bytes, window);

  nlohmann::json json = {{"benchmark", "curl_transport"},
                         {"requests", requests},
                         {"window", window},
                         {"body_bytes", body_bytes},
                         {"bare_cpu_us_per_request", bare_us},
                         {"transport_cpu_us_per_request", wharf_us},
                         {"overhead_cpu_us_per_request", wharf_us - bare_us}};
  std::ofstream(json_path) << json.dump(2) << "\n";
  return (bare.failures + wharf.failures + bare2.failures + wharf2.failures) == 0 ? 0 : 1;
}

}  // namespace
}  // namespace wharf

int main(int argc, char** argv) { return wharf::Main(argc, argv); }
