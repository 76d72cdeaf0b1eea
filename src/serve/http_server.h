#pragma once
// A small HTTP/1.1 server (Boost.Beast underneath, kept out of this header): keep-alive, N I/O threads and a pool of
// workers that run the handler (cheap requests can stay on the I/O threads), a request body limit answered with 413
// before the body is read, a read timeout for slow or idle clients, accept errors (out of file descriptors) that back
// off instead of spinning, and a graceful stop that stops accepting, lets in-flight requests finish and then returns
// from Run().
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace osprey::serve {

class RequestMemory;

/// One request as the handler sees it. The body is fully read.
struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path with query, as sent
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  /// Set for requests run on a worker: whether the client has closed its connection since it sent this request (so
  /// nobody will read the answer). Thread-safe, cheap.
  std::function<bool()> client_gone;
  /// Value of the first header named `name` (case-insensitive), "" when absent.
  std::string Header(std::string_view name) const;
};

/// The handler's answer. Content-Length is set by the server.
struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

/// Called on a worker (or, for requests `run_inline` picks, an I/O) thread, concurrently from several threads.
/// Exceptions become a 500 JSON error.
using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0 = any free port (see HttpServer::port())
  int io_threads = 4;
  int64_t max_body_bytes = 64 << 20;
  double read_timeout_seconds = 30;  // a request (header and body) or an idle keep-alive gap longer than this closes
  bool stop_on_signals = true;       // SIGINT/SIGTERM call Stop()
  /// Workers that run the handler, so that I/O threads only read, parse and write (0 = run it on the I/O threads).
  int worker_threads = 0;
  /// Requests waiting for a worker beyond those running; more get 503 with Retry-After at once, except for a lane
  /// holding less than its share of them (serve/lane_pool.h).
  int max_pending = 1024;
  /// The lane of a request run on a worker (its model's name; "" = none): a free worker takes the oldest request of
  /// the lane that holds the fewest workers (serve/lane_pool.h), so one model's flood cannot starve the others.
  /// Empty: one lane, first in first out. Called on an I/O thread: must be cheap and must not throw.
  std::function<std::string(const HttpRequest&)> lane;
  /// The bytes of request bodies held at once over all connections (serve/request_memory.h; null = no limit): a
  /// request whose Content-Length (or --max-body-size, chunked) does not fit gets 503 with Retry-After before its body
  /// is read.
  std::shared_ptr<RequestMemory> request_memory;
  /// Requests that are cheap and must stay fast while every worker is busy (health, metrics): run on the I/O thread.
  std::function<bool(const HttpRequest&)> run_inline;
};

class HttpServer {
 public:
  /// Binds and listens (throws osprey::Error kUnavailable when the address cannot be bound).
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();
  /// The bound port.
  int port() const;
  /// Serves on options.io_threads threads until Stop() (or a signal); returns when every connection is closed.
  void Run();
  /// Thread-safe and idempotent: stop accepting, close idle connections, finish in-flight requests.
  void Stop();

  struct Impl;  // defined in http_server.cc (public only so that its connection class can name it)

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace osprey::serve
