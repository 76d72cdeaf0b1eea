#pragma once
// The KServe v2 gRPC API (inference.GRPCInferenceService, src/serve/proto/inference.proto) beside REST, on its own
// port: the same InferenceServer operations, model manager, scheduler and limits. What tritonclient.grpc speaks.
#include <memory>
#include <string>

namespace osprey::serve {

class InferenceServer;
class RequestMemory;

struct GrpcServerOptions {
  std::string host = "127.0.0.1";
  int port = 8001;                        // 0 = any free port (see GrpcServer::port())
  int64_t max_message_bytes = 64 << 20;   // largest request message (as --max-body-size for REST)
  int threads = 4;                        // workers that run calls (as --workers; a pool of their own)
  int waiting = 256;  // calls held beyond those without a thread (as --max-queue); beyond, a call for a model that
                      // holds its share of them is UNAVAILABLE (serve/lane_pool.h)
  /// The bytes of requests held at once, shared with REST (serve/request_memory.h; null = no limit): an infer call
  /// whose message does not fit is UNAVAILABLE at once.
  std::shared_ptr<RequestMemory> request_memory;
};

class GrpcServer {
 public:
  /// Starts serving at once (gRPC's threads take calls, the pool's workers run them). Throws Error kUnavailable when
  /// the address cannot be bound.
  GrpcServer(InferenceServer* server, GrpcServerOptions options);
  ~GrpcServer();  // Shutdown()
  int port() const;
  /// Stops accepting and waits for the calls in flight (idempotent).
  void Shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace osprey::serve
