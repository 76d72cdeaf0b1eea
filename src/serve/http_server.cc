#include "serve/http_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "osprey/error.h"
#include "serve/lane_pool.h"
#include "serve/log.h"
#include "serve/request_memory.h"

namespace osprey::serve {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

// A connection's read buffer: what a request header needs, and up to 64 KiB (Beast's largest read) while a body is
// read; an idle connection shrinks back to the first.
constexpr size_t kHeaderReadBytes = 4096;
constexpr size_t kBodyReadBytes = 64 * 1024;

std::string JsonError(const std::string& message) {
  std::string out = "{\"error\": \"";
  for (char c : message) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out + "\"}";
}

}  // namespace

std::string HttpRequest::Header(std::string_view name) const {
  for (const auto& [key, value] : headers)
    if (EqualsIgnoreCase(key, name)) return value;
  return "";
}

class Session;

struct HttpServer::Impl {
  HttpServerOptions options;
  HttpHandler handler;
  net::io_context ioc;
  tcp::acceptor acceptor{net::make_strand(ioc)};
  net::signal_set signals{ioc};
  net::steady_timer accept_backoff{acceptor.get_executor()};  // on the acceptor's strand
  std::chrono::steady_clock::time_point last_accept_warning{};
  std::unique_ptr<LanePool> workers;  // in lanes (options.lane): one model's flood cannot starve the others
  std::atomic<bool> stopping{false};
  std::mutex sessions_mu;
  std::map<Session*, std::weak_ptr<Session>> sessions;

  std::chrono::steady_clock::duration Timeout() const {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(std::max(0.001, options.read_timeout_seconds)));
  }
  void Accept(std::shared_ptr<Impl> self);
  void StopNow();
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, std::shared_ptr<HttpServer::Impl> server)
      : stream_(std::move(socket)), server_(std::move(server)) {}
  ~Session() {
    std::lock_guard<std::mutex> lock(server_->sessions_mu);
    server_->sessions.erase(this);
  }

  void Start() {
    net::dispatch(stream_.get_executor(), beast::bind_front_handler(&Session::ReadHeader, shared_from_this()));
  }

  // Closes the connection when it waits for a new request; a request in flight finishes first (see OnWrite).
  void StopIfIdle() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      if (self->idle_) self->Close();
    });
  }

 private:
  void ReadHeader() {
    if (server_->stopping) return Close();
    hold_.reset();
    parser_.emplace();
    if (buffer_.size() == 0 && buffer_.capacity() > kHeaderReadBytes) buffer_.shrink_to_fit();  // idle: give it back
    parser_->header_limit(64 * 1024);
    parser_->body_limit(static_cast<uint64_t>(std::max<int64_t>(0, server_->options.max_body_bytes)));
    idle_ = buffer_.size() == 0;
    stream_.expires_after(server_->Timeout());
    http::async_read_header(stream_, buffer_, *parser_,
                            beast::bind_front_handler(&Session::OnHeader, shared_from_this()));
  }

  void OnHeader(beast::error_code ec, size_t) {
    idle_ = false;
    started_ = std::chrono::steady_clock::now();
    method_ = std::string(parser_->get().method_string());
    target_ = std::string(parser_->get().target());
    bytes_in_ = 0;
    if (ec == http::error::body_limit)  // the parser checks Content-Length against the limit with the header
      return SendSimple(
          413,
          "request body is larger than --max-body-size (" + std::to_string(server_->options.max_body_bytes) + " bytes)",
          true);
    if (ec) {
      if (ec.category() == http::make_error_code(http::error::end_of_stream).category() &&
          ec != http::error::end_of_stream)
        return SendSimple(ec == http::error::header_limit ? 431 : 400, "malformed HTTP request: " + ec.message(),
                          false);
      return Close();
    }
    auto length = parser_->content_length();
    const uint64_t limit = static_cast<uint64_t>(std::max<int64_t>(0, server_->options.max_body_bytes));
    if (length && *length > limit)
      return SendSimple(413,
                        "request body of " + std::to_string(*length) + " bytes is larger than --max-body-size (" +
                            std::to_string(limit) + " bytes)",
                        true);
    if (server_->options.request_memory) {
      // Refused at once when the announced body would not fit now (chunked: nothing announced); then counted as it
      // arrives (OnBodyPart).
      const int64_t bytes = static_cast<int64_t>(length.value_or(0));
      hold_ = server_->options.request_memory->Admit(bytes);
      if (!hold_)
        return Send(HttpResponse{503,
                                 "application/json",
                                 {{"Retry-After", "1"}},
                                 JsonError(server_->options.request_memory->Refusal(bytes))},
                    false, 11, true);
    }
    if (EqualsIgnoreCase(std::string(parser_->get()[http::field::expect]), "100-continue")) {
      auto cont = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
      stream_.expires_after(server_->Timeout());
      http::async_write(stream_, *cont, [self = shared_from_this(), cont](beast::error_code ec, size_t) {
        if (ec) return self->Close();
        self->ReadBody();
      });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    // Beast reads as much as the buffer has room for, at least 512 bytes: a buffer of the header's size read a 600 KB
    // tensor 512 bytes a system call (1,200 calls, 4.5 ms; the model ran in 3.3).
    if (parser_->content_length().value_or(kBodyReadBytes) > kHeaderReadBytes) buffer_.reserve(kBodyReadBytes);
    stream_.expires_after(server_->Timeout());  // for the whole body, not each part
    ReadBodyPart();
  }
  void ReadBodyPart() {
    if (parser_->is_done()) return OnBodyPart({}, 0);  // no body, or all of it came with the header
    http::async_read_some(stream_, buffer_, *parser_,
                          beast::bind_front_handler(&Session::OnBodyPart, shared_from_this()));
  }
  // Each part read: the body so far is held in --max-request-memory (refused with 503 mid-body when it does not fit).
  void OnBodyPart(beast::error_code ec, size_t n) {
    if (!ec && hold_ && !hold_->GrowTo(static_cast<int64_t>(parser_->get().body().size()))) {
      const int64_t bytes = static_cast<int64_t>(parser_->content_length().value_or(parser_->get().body().size()));
      return Send(HttpResponse{503,
                               "application/json",
                               {{"Retry-After", "1"}},
                               JsonError(server_->options.request_memory->Refusal(bytes))},
                  false, 11, true);
    }
    if (ec || parser_->is_done()) return OnBody(ec, n);
    ReadBodyPart();
  }

  void OnBody(beast::error_code ec, size_t) {
    if (ec == http::error::body_limit)
      return SendSimple(
          413,
          "request body is larger than --max-body-size (" + std::to_string(server_->options.max_body_bytes) + " bytes)",
          true);
    if (ec) return Close();
    http::request<http::string_body> message = parser_->release();
    HttpRequest request;
    request.method = std::string(message.method_string());
    request.target = std::string(message.target());
    for (const auto& field : message) request.headers.emplace_back(field.name_string(), field.value());
    request.body = std::move(message.body());
    bytes_in_ = request.body.size();
    const bool keep_alive = message.keep_alive();
    const unsigned version = message.version();
    HttpServer::Impl& server = *server_;
    if (!server.workers || (server.options.run_inline && server.options.run_inline(request))) {
      HttpResponse response = Call(request);
      hold_.reset();
      return Send(std::move(response), keep_alive && !server.stopping, version, false);
    }
    auto gone = std::make_shared<std::atomic<bool>>(false);
    request.client_gone = [gone] { return gone->load(std::memory_order_relaxed); };
    WatchClient(gone);
    // The guard keeps the I/O threads running until the answer is written, even when nothing else is pending.
    auto guard = net::make_work_guard(stream_.get_executor());
    const std::string lane = server.options.lane ? server.options.lane(request) : std::string();
    const bool queued = server.workers->Post(lane, [self = shared_from_this(), request = std::move(request), keep_alive,
                                                    version, guard = std::move(guard),
                                                    hold = std::move(hold_)]() mutable {
      HttpResponse response = self->Call(request);
      request = HttpRequest();  // its body goes back to the budget before the answer is written
      hold.reset();
      net::post(self->stream_.get_executor(), [self, response = std::move(response), keep_alive, version]() mutable {
        self->StopWatching();
        self->Send(std::move(response), keep_alive && !self->server_->stopping, version, false);
      });
    });
    if (!queued) {
      StopWatching();
      HttpResponse busy{503, "application/json", {{"Retry-After", "1"}}, JsonError(server.workers->Refusal())};
      Send(std::move(busy), keep_alive && !server.stopping, version, false);
    }
  }

  // While a worker runs this connection's request: a wait for the socket to become readable (no byte consumed), then
  // a peek. End of stream or an error: the client closed the connection, nobody will read the answer (`gone`, which
  // the run checks between steps). A byte: the client sent its next request already (pipelining): it is there, and
  // watching stops.
  void WatchClient(std::shared_ptr<std::atomic<bool>> gone) {
    if (buffer_.size() > 0) return;  // already holds more from the client
    watching_ = true;
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), gone](beast::error_code ec) {
      if (ec || !self->watching_) return;  // cancelled: the answer is being sent
      char byte;
      const ssize_t n = ::recv(self->stream_.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return self->WatchClient(gone);
      self->watching_ = false;
      if (n <= 0) gone->store(true, std::memory_order_relaxed);
    });
  }
  void StopWatching() {
    if (!watching_) return;
    watching_ = false;
    beast::error_code ignored;
    stream_.socket().cancel(ignored);
  }

  HttpResponse Call(const HttpRequest& request) {
    try {
      return server_->handler(request);
    } catch (const std::exception& e) {
      return HttpResponse{500, "application/json", {}, JsonError(std::string("internal error: ") + e.what())};
    } catch (...) {
      return HttpResponse{500, "application/json", {}, JsonError("internal error")};
    }
  }

  void SendSimple(int status, const std::string& message, bool drain) {
    Send(HttpResponse{status, "application/json", {}, JsonError(message)}, false, 11, drain);
  }

  void Send(HttpResponse response, bool keep_alive, unsigned version, bool drain) {
    log::Request(method_.empty() ? "-" : method_, target_.empty() ? "-" : target_, response.status, bytes_in_,
                 response.body.size(),
                 std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - started_).count(),
                 response.body);
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(response.status),
                                                                   version == 10 ? 10 : 11);
    res->set(http::field::server, "osprey");
    res->set(http::field::content_type, response.content_type);
    for (const auto& [key, value] : response.headers) res->set(key, value);
    res->body() = std::move(response.body);
    res->keep_alive(keep_alive);
    res->prepare_payload();
    stream_.expires_after(server_->Timeout());
    http::async_write(stream_, *res, [self = shared_from_this(), res, keep_alive, drain](beast::error_code ec, size_t) {
      if (ec) return self->Close();
      if (!keep_alive || self->server_->stopping) {
        if (drain) return self->Drain();
        return self->Close();
      }
      self->ReadHeader();
    });
  }

  // After an early answer (413) the client may still be sending its body; closing with unread bytes would reset the
  // connection and could destroy the answer in flight, so read and discard until the client closes or times out.
  void Drain() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    drain_buffer_.resize(64 * 1024);
    stream_.expires_after(std::chrono::seconds(5));
    DrainMore();
  }
  void DrainMore() {
    stream_.async_read_some(net::buffer(drain_buffer_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->Close();
      self->DrainMore();
    });
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  std::shared_ptr<HttpServer::Impl> server_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::vector<char> drain_buffer_;
  std::shared_ptr<RequestMemory::Hold> hold_;  // the request's share of --max-request-memory, while it is held
  bool idle_ = false;
  bool watching_ = false;  // WatchClient is waiting on the socket (on this session's strand)
  // The request being answered, for the log.
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::string method_, target_;
  size_t bytes_in_ = 0;
};

void HttpServer::Impl::Accept(std::shared_ptr<Impl> self) {
  acceptor.async_accept(net::make_strand(ioc), [self](beast::error_code ec, tcp::socket socket) {
    if (self->stopping || !self->acceptor.is_open()) return;
    if (ec == net::error::no_descriptors || ec == net::error::no_buffer_space || ec == net::error::no_memory ||
        ec.value() == ENFILE) {
      // Out of file descriptors or memory: retrying at once would spin a core. Wait, so that connections close.
      const auto now = std::chrono::steady_clock::now();
      if (now - self->last_accept_warning > std::chrono::seconds(10)) {
        self->last_accept_warning = now;
        log::Event(log::Level::kWarning, "accept_failed",
                   "cannot accept connections (" + ec.message() +
                       "); retrying every 100 ms (raise the open-files limit, ulimit -n)");
      }
      self->accept_backoff.expires_after(std::chrono::milliseconds(100));
      self->accept_backoff.async_wait([self](beast::error_code) {
        if (!self->stopping) self->Accept(self);
      });
      return;
    }
    if (!ec) {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      auto session = std::make_shared<Session>(std::move(socket), self);
      {
        std::lock_guard<std::mutex> lock(self->sessions_mu);
        self->sessions[session.get()] = session;
      }
      session->Start();
    }
    self->Accept(self);
  });
}

void HttpServer::Impl::StopNow() {
  if (stopping.exchange(true)) return;
  net::post(acceptor.get_executor(), [this] {
    beast::error_code ignored;
    acceptor.close(ignored);
    accept_backoff.cancel();
  });
  net::post(ioc, [this] {
    beast::error_code ignored;
    signals.cancel(ignored);
  });
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard<std::mutex> lock(sessions_mu);
    for (auto& [ptr, weak] : sessions)
      if (auto s = weak.lock()) live.push_back(std::move(s));
  }
  for (auto& s : live) s->StopIfIdle();
}

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler) : impl_(std::make_shared<Impl>()) {
  impl_->options = std::move(options);
  impl_->handler = std::move(handler);
  try {
    tcp::endpoint endpoint(net::ip::make_address(impl_->options.host), static_cast<uint16_t>(impl_->options.port));
    impl_->acceptor.open(endpoint.protocol());
    impl_->acceptor.set_option(net::socket_base::reuse_address(true));
    impl_->acceptor.bind(endpoint);
    impl_->acceptor.listen(net::socket_base::max_listen_connections);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kUnavailable, "serve: cannot listen on " + impl_->options.host + ":" +
                                             std::to_string(impl_->options.port) + ": " + e.what());
  }
}

HttpServer::~HttpServer() {
  Stop();
  impl_->ioc.stop();
}

int HttpServer::port() const { return impl_->acceptor.local_endpoint().port(); }

void HttpServer::Run() {
  auto impl = impl_;
  if (impl->options.stop_on_signals) {
    impl->signals.add(SIGINT);
    impl->signals.add(SIGTERM);
    impl->signals.async_wait([impl](beast::error_code ec, int) {
      if (!ec) impl->StopNow();
    });
  }
  if (impl->options.worker_threads > 0)
    impl->workers =
        std::make_unique<LanePool>(impl->options.worker_threads,
                                   std::max(1, impl->options.worker_threads) + std::max(0, impl->options.max_pending));
  impl->Accept(impl);
  const int n = std::max(1, impl->options.io_threads);
  std::vector<std::thread> threads;
  for (int i = 1; i < n; ++i) threads.emplace_back([impl] { impl->ioc.run(); });
  impl->ioc.run();
  for (auto& t : threads) t.join();
  if (impl->workers) impl->workers->Join();
}

void HttpServer::Stop() { impl_->StopNow(); }

}  // namespace osprey::serve
