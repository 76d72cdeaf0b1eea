#include "serve/grpc_server.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <limits>
#include <type_traits>

#include "osprey/error.h"
#include "serve/kserve.h"
#include "serve/lane_pool.h"
#include "serve/log.h"
#include "serve/proto/inference.grpc.pb.h"
#include "serve/request_memory.h"
#include "serve/server.h"

namespace osprey::serve {
namespace {

using json = nlohmann::json;

grpc::Status ToStatus(const Error& e) {
  if (dynamic_cast<const RequestTooLarge*>(&e)) return {grpc::StatusCode::RESOURCE_EXHAUSTED, e.what()};
  switch (e.code()) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kUnsupported:
      return {grpc::StatusCode::INVALID_ARGUMENT, e.what()};
    case ErrorCode::kNotFound:
      return {grpc::StatusCode::NOT_FOUND, e.what()};
    case ErrorCode::kResourceExhausted:
      return {grpc::StatusCode::RESOURCE_EXHAUSTED, e.what()};
    case ErrorCode::kUnavailable:
      return {grpc::StatusCode::UNAVAILABLE, e.what()};
    case ErrorCode::kDeadlineExceeded:
      return {grpc::StatusCode::DEADLINE_EXCEEDED, e.what()};
    case ErrorCode::kCancelled:
      return {grpc::StatusCode::CANCELLED, e.what()};
    default:
      return {grpc::StatusCode::INTERNAL, e.what()};
  }
}

// Runs one call: osprey errors become gRPC status codes, and each call is logged as a REST request would be.
template <class F>
grpc::Status Call(const char* method, const std::string& model, F&& body) {
  const auto start = std::chrono::steady_clock::now();
  grpc::Status status;
  try {
    body();
  } catch (const Error& e) {
    status = ToStatus(e);
  } catch (const json::exception& e) {
    status = {grpc::StatusCode::INVALID_ARGUMENT, std::string("malformed request: ") + e.what()};
  } catch (const std::bad_alloc&) {
    status = {grpc::StatusCode::RESOURCE_EXHAUSTED, "out of memory"};
  } catch (const std::exception& e) {
    status = {grpc::StatusCode::INTERNAL, std::string("internal error: ") + e.what()};
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  const int http_like = status.ok()                                                   ? 200
                        : status.error_code() == grpc::StatusCode::NOT_FOUND          ? 404
                        : status.error_code() == grpc::StatusCode::INVALID_ARGUMENT   ? 400
                        : status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ? 413
                        : status.error_code() == grpc::StatusCode::UNAVAILABLE        ? 503
                        : status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED  ? 504
                        : status.error_code() == grpc::StatusCode::CANCELLED          ? 499
                                                                                      : 500;
  log::Request("GRPC", std::string("/inference.GRPCInferenceService/") + method + (model.empty() ? "" : "/" + model),
               http_like, 0, 0, us, status.ok() ? "" : json({{"error", status.error_message()}}).dump());
  return status;
}

// The call's deadline (grpc-timeout), if the client set one, and its cancel check (the client cancelled the call or
// went away).
Deadline CallDeadline(grpc::CallbackServerContext* context) {
  Deadline d;
  d.cancelled = [context] { return context->IsCancelled(); };
  d.cancel_reason = "the gRPC call was cancelled";
  const auto at = context->deadline();
  if (at >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) return d;
  const auto left = at - std::chrono::system_clock::now();
  d.at = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(left);
  d.reason = "the gRPC call's deadline";
  return d;
}

// JSON (field names as the proto's) into a message; unknown fields (osprey's extras) are skipped.
template <class Message>
void FromJson(const json& j, Message* message) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto status = google::protobuf::util::JsonStringToMessage(j.dump(), message, options);
  if (!status.ok()) throw Error(ErrorCode::kInternal, "gRPC answer: " + std::string(status.message()));
}

json ParameterJson(const inference::InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kBoolParam: return p.bool_param();
    case inference::InferParameter::kInt64Param: return p.int64_param();
    case inference::InferParameter::kStringParam: return p.string_param();
    case inference::InferParameter::kDoubleParam: return p.double_param();
    case inference::InferParameter::kUint64Param: return p.uint64_param();
    default: return nullptr;
  }
}

template <class Map>
json ParametersJson(const Map& parameters) {
  json out = json::object();
  for (const auto& [key, value] : parameters) out[key] = ParameterJson(value);
  return out;
}

json RepositoryParametersJson(const google::protobuf::Map<std::string, inference::ModelRepositoryParameter>& map) {
  if (map.empty()) return nullptr;
  json out = json::object();
  for (const auto& [key, p] : map) {
    switch (p.parameter_choice_case()) {
      case inference::ModelRepositoryParameter::kBoolParam: out[key] = p.bool_param(); break;
      case inference::ModelRepositoryParameter::kInt64Param: out[key] = p.int64_param(); break;
      case inference::ModelRepositoryParameter::kStringParam: out[key] = p.string_param(); break;
      default: out[key] = "(bytes)"; break;
    }
  }
  return out;
}

template <class To, class From>
void AppendAs(const google::protobuf::RepeatedField<From>& values, const std::string& what, std::string* out) {
  for (const From v : values) {
    if constexpr (std::is_integral_v<To> && !std::is_same_v<To, bool>) {
      if (static_cast<long double>(v) < static_cast<long double>(std::numeric_limits<To>::min()) ||
          static_cast<long double>(v) > static_cast<long double>(std::numeric_limits<To>::max()))
        throw Error(ErrorCode::kInvalidArgument, what + ": value " + std::to_string(v) + " does not fit its datatype");
    }
    const To t = static_cast<To>(v);
    out->append(reinterpret_cast<const char*>(&t), sizeof(To));
  }
}

// The typed contents of one input as the little-endian bytes of its datatype (KServe: int_contents carries INT8,
// INT16 and INT32, uint_contents UINT8, UINT16 and UINT32). A datatype osprey has no tensor for is left to the decoder
// to refuse by name; FP16/BF16 have no typed field and must come as raw_input_contents.
void ContentsToBytes(const std::string& datatype, const inference::InferTensorContents& c, const std::string& name,
                     std::string* out) {
  const std::string what = "input '" + name + "'";
  if (datatype == "FP32") return AppendAs<float>(c.fp32_contents(), what, out);
  if (datatype == "INT64") return AppendAs<int64_t>(c.int64_contents(), what, out);
  if (datatype == "INT32") return AppendAs<int32_t>(c.int_contents(), what, out);
  if (datatype == "INT8") return AppendAs<int8_t>(c.int_contents(), what, out);
  if (datatype == "UINT8") return AppendAs<uint8_t>(c.uint_contents(), what, out);
  if (datatype == "BOOL") return AppendAs<bool>(c.bool_contents(), what, out);
  if (datatype == "FP16" || datatype == "BF16")
    throw Error(ErrorCode::kInvalidArgument,
                what + ": " + datatype + " has no typed contents field; send it in raw_input_contents");
}

// A ModelInferRequest as the REST binary-extension body (JSON header + binary section), so that one decoder
// (DecodeInferRequest) checks both protocols: raw_input_contents, BYTES and typed contents all go to the binary
// section. Inputs in shared memory (parameters.shared_memory_region) carry no contents: raw_input_contents holds the
// others', in order.
std::string RestBody(const inference::ModelInferRequest& request, std::string* header_length) {
  json header = json::object();
  if (!request.id().empty()) header["id"] = request.id();
  if (!request.parameters().empty()) header["parameters"] = ParametersJson(request.parameters());
  const bool raw = request.raw_input_contents_size() > 0;
  int raw_used = 0, in_shared_memory = 0;
  for (const auto& in : request.inputs()) in_shared_memory += in.parameters().count("shared_memory_region") ? 1 : 0;
  if (raw && request.raw_input_contents_size() != request.inputs_size() - in_shared_memory)
    throw Error(ErrorCode::kInvalidArgument,
                "raw_input_contents has " + std::to_string(request.raw_input_contents_size()) + " entries for " +
                    std::to_string(request.inputs_size() - in_shared_memory) + " inputs not in shared memory");
  std::string binary;
  header["inputs"] = json::array();
  for (int i = 0; i < request.inputs_size(); ++i) {
    const auto& in = request.inputs(i);
    json j = {{"name", in.name()},
              {"datatype", in.datatype()},
              {"shape", std::vector<int64_t>(in.shape().begin(), in.shape().end())}};
    json parameters = ParametersJson(in.parameters());
    const auto& c = in.contents();
    if (parameters.contains("shared_memory_region")) {
      // read from the region by the decoder
    } else if (raw) {
      parameters["binary_data_size"] = request.raw_input_contents(raw_used).size();
      binary += request.raw_input_contents(raw_used++);
    } else if (c.bytes_contents_size() > 0) {
      const size_t before = binary.size();
      for (const std::string& element : c.bytes_contents()) AppendBinaryBytes(&binary, element);
      parameters["binary_data_size"] = binary.size() - before;
    } else {
      // Typed contents go to the binary section as the datatype's bytes (never through JSON, whose per-value
      // objects would multiply a large message's memory).
      const size_t before = binary.size();
      ContentsToBytes(in.datatype(), c, in.name(), &binary);
      parameters["binary_data_size"] = binary.size() - before;
    }
    if (!parameters.empty()) j["parameters"] = parameters;
    header["inputs"].push_back(std::move(j));
  }
  if (request.outputs_size() > 0) {
    header["outputs"] = json::array();
    for (const auto& o : request.outputs()) {
      json j = {{"name", o.name()}};
      json parameters = ParametersJson(o.parameters());
      if (!parameters.empty()) j["parameters"] = parameters;
      header["outputs"].push_back(std::move(j));
    }
  }
  std::string body = header.dump();
  *header_length = std::to_string(body.size());
  return body + binary;
}

// The callback API: a call holds no thread while it waits. Every method but the health checks goes to the pool's
// workers in the lane of its model (serve/lane_pool.h, as REST requests), so a flood of one model neither holds
// threads that other models' calls need nor is taken ahead of them; a call the pool refuses is UNAVAILABLE at once.
class Service final : public inference::GRPCInferenceService::CallbackService {
 public:
  Service(InferenceServer* server, LanePool* pool, std::shared_ptr<RequestMemory> memory)
      : server_(server), pool_(pool), memory_(std::move(memory)) {}

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context, const inference::ServerLiveRequest*,
                                       inference::ServerLiveResponse* response) override {
    response->set_live(true);
    return Done(context, grpc::Status::OK);
  }
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context, const inference::ServerReadyRequest*,
                                        inference::ServerReadyResponse* response) override {
    response->set_ready(true);
    return Done(context, grpc::Status::OK);
  }
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const inference::ModelReadyRequest* request,
                                       inference::ModelReadyResponse* response) override {
    return Queue(context, "ModelReady", request->name(),
                 [=, this] { response->set_ready(server_->ModelReady(request->name(), request->version())); });
  }
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const inference::ServerMetadataRequest*,
                                           inference::ServerMetadataResponse* response) override {
    return Queue(context, "ServerMetadata", "", [=, this] { FromJson(server_->ServerMetadata(), response); });
  }
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const inference::ModelMetadataRequest* request,
                                          inference::ModelMetadataResponse* response) override {
    return Queue(context, "ModelMetadata", request->name(),
                 [=, this] { FromJson(server_->ModelMetadata(request->name(), request->version()), response); });
  }
  grpc::ServerUnaryReactor* ModelConfig(grpc::CallbackServerContext* context,
                                        const inference::ModelConfigRequest* request,
                                        inference::ModelConfigResponse* response) override {
    return Queue(context, "ModelConfig", request->name(), [=, this] {
      *response->mutable_config() = *server_->ModelConfig(request->name(), request->version());
    });
  }
  grpc::ServerUnaryReactor* ModelStatistics(grpc::CallbackServerContext* context,
                                            const inference::ModelStatisticsRequest* request,
                                            inference::ModelStatisticsResponse* response) override {
    return Queue(context, "ModelStatistics", request->name(),
                 [=, this] { FromJson(server_->Statistics(request->name(), request->version()), response); });
  }
  grpc::ServerUnaryReactor* RepositoryIndex(grpc::CallbackServerContext* context,
                                            const inference::RepositoryIndexRequest* request,
                                            inference::RepositoryIndexResponse* response) override {
    return Queue(context, "RepositoryIndex", "", [=, this] {
      FromJson(json{{"models", server_->RepositoryIndex(request->ready())}}, response);
    });
  }
  grpc::ServerUnaryReactor* RepositoryModelLoad(grpc::CallbackServerContext* context,
                                                const inference::RepositoryModelLoadRequest* request,
                                                inference::RepositoryModelLoadResponse*) override {
    return Queue(context, "RepositoryModelLoad", request->model_name(), [=, this] {
      server_->LoadModel(request->model_name(), RepositoryParametersJson(request->parameters()));
    });
  }
  grpc::ServerUnaryReactor* RepositoryModelUnload(grpc::CallbackServerContext* context,
                                                  const inference::RepositoryModelUnloadRequest* request,
                                                  inference::RepositoryModelUnloadResponse*) override {
    return Queue(context, "RepositoryModelUnload", request->model_name(), [=, this] {
      server_->UnloadModel(request->model_name(), RepositoryParametersJson(request->parameters()));
    });
  }
  grpc::ServerUnaryReactor* SystemSharedMemoryStatus(grpc::CallbackServerContext* context,
                                                     const inference::SystemSharedMemoryStatusRequest* request,
                                                     inference::SystemSharedMemoryStatusResponse* response) override {
    return Queue(context, "SystemSharedMemoryStatus", "", [=, this] {
      for (const json& r : server_->SharedMemoryStatus(request->name())) {
        auto& status = (*response->mutable_regions())[r["name"].get<std::string>()];
        status.set_name(r["name"].get<std::string>());
        status.set_key(r["key"].get<std::string>());
        status.set_offset(r["offset"].get<uint64_t>());
        status.set_byte_size(r["byte_size"].get<uint64_t>());
      }
    });
  }
  grpc::ServerUnaryReactor* SystemSharedMemoryRegister(grpc::CallbackServerContext* context,
                                                       const inference::SystemSharedMemoryRegisterRequest* request,
                                                       inference::SystemSharedMemoryRegisterResponse*) override {
    return Queue(context, "SystemSharedMemoryRegister", "", [=, this] {
      server_->RegisterSharedMemory(request->name(), request->key(), request->offset(), request->byte_size());
    });
  }
  grpc::ServerUnaryReactor* SystemSharedMemoryUnregister(grpc::CallbackServerContext* context,
                                                         const inference::SystemSharedMemoryUnregisterRequest* request,
                                                         inference::SystemSharedMemoryUnregisterResponse*) override {
    return Queue(context, "SystemSharedMemoryUnregister", "",
                 [=, this] { server_->UnregisterSharedMemory(request->name()); });
  }
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const inference::ModelInferRequest* request,
                                       inference::ModelInferResponse* response) override {
    return Queue(
        context, "ModelInfer", request->model_name(), static_cast<int64_t>(request->ByteSizeLong()), [=, this] {
          std::string header_length;
          const std::string body = RestBody(*request, &header_length);
          const std::string& model = request->model_name();
          InferenceServer::InferResult r = server_->Infer(
              model, request->model_version(),
              [&](const std::vector<ValueInfo>& inputs, const RequestLimits& limits, const ImageInputDecoder& images,
                  const SharedMemoryRegions* shared_memory) {
                return DecodeInferRequest(inputs, model, body, header_length, limits, images, shared_memory);
              },
              CallDeadline(context));
          response->set_model_name(r.loaded->name);
          response->set_model_version(r.loaded->version);
          response->set_id(request->id());
          for (const ResponseOutput& out :
               SelectOutputs(r.request.header, model, r.results, r.loaded->directory.labels, r.shared_memory)) {
            auto* o = response->add_outputs();
            o->set_name(out.name);
            o->set_datatype(out.datatype);
            for (int64_t d : out.shape) o->add_shape(d);
            // One entry per output, empty for one in shared memory: clients find an output's contents by its index.
            std::string* raw = response->add_raw_output_contents();
            if (out.shared_memory) {
              // written there by SelectOutputs
            } else if (out.datatype == "BYTES") {
              for (const std::string& s : out.strings) AppendBinaryBytes(raw, s);
            } else {
              raw->assign(static_cast<const char*>(out.tensor.raw()), out.tensor.nbytes());
            }
          }
        });
  }

 private:
  static grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const grpc::Status& status) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  }
  // Runs `body` (Call: errors as status codes, the access log) on a worker in `model`'s lane, holding `bytes` (the
  // request message's) of --max-request-memory until it is answered. The request and response messages live until
  // Finish.
  template <class F>
  grpc::ServerUnaryReactor* Queue(grpc::CallbackServerContext* context, const char* method, const std::string& model,
                                  int64_t bytes, F body) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    auto refuse = [&](const std::string& why) {
      reactor->Finish(Call(method, model, [&] { throw Error(ErrorCode::kUnavailable, why); }));
      return reactor;
    };
    std::shared_ptr<RequestMemory::Hold> hold = memory_ ? memory_->Take(bytes) : nullptr;
    if (memory_ && !hold) return refuse(memory_->Refusal(bytes));
    if (!pool_->Post(model, [reactor, method, model, body = std::move(body), hold = std::move(hold)]() mutable {
          grpc::Status status = Call(method, model, body);
          hold.reset();
          reactor->Finish(status);
        }))
      return refuse(pool_->Refusal());
    return reactor;
  }
  template <class F>
  grpc::ServerUnaryReactor* Queue(grpc::CallbackServerContext* context, const char* method, const std::string& model,
                                  F body) {
    return Queue(context, method, model, 0, std::move(body));
  }

  InferenceServer* server_;
  LanePool* pool_;
  std::shared_ptr<RequestMemory> memory_;
};

}  // namespace

struct GrpcServer::Impl {
  std::unique_ptr<LanePool> pool;  // outlives the server: Shutdown waits for the calls it still holds
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  bool shut_down = false;
};

GrpcServer::GrpcServer(InferenceServer* server, GrpcServerOptions options) : impl_(std::make_unique<Impl>()) {
  const int threads = std::max(1, options.threads);
  impl_->pool = std::make_unique<LanePool>(threads, threads + std::max(0, options.waiting));
  impl_->service = std::make_unique<Service>(server, impl_->pool.get(), options.request_memory);
  grpc::ServerBuilder builder;
  const std::string host = options.host.find(':') != std::string::npos ? "[" + options.host + "]" : options.host;
  builder.AddListeningPort(host + ":" + std::to_string(options.port), grpc::InsecureServerCredentials(), &impl_->port);
  builder.RegisterService(impl_->service.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT32_MAX)));
  builder.SetMaxSendMessageSize(INT32_MAX);
  // gRPC reads a call's whole message before the service sees it, granting each stream the window its announced
  // length asks for: without a quota, clients announcing large messages on many streams and never finishing them
  // held every byte they sent (measured: 32 streams of 57 MiB, 1.8 GiB resident under a 1G --max-request-memory).
  // gRPC's memory quota bounds the bytes in transit (under pressure it shrinks windows, then resets streams and
  // connections: clients see UNAVAILABLE or RESOURCE_EXHAUSTED and retry). It is --max-request-memory, but at least
  // two largest messages and some room, so that refusals below it stay the budget's own (per call, UNAVAILABLE).
  if (options.request_memory && options.request_memory->limit() > 0) {
    grpc::ResourceQuota quota("osprey-grpc");
    constexpr int64_t kHuge = std::numeric_limits<int64_t>::max() / 4;  // --max-body-size of exabytes: no overflow
    const int64_t two_messages = 2 * std::min(options.max_message_bytes, kHuge);
    quota.Resize(static_cast<size_t>(std::max(options.request_memory->limit(), two_messages + (int64_t{16} << 20))));
    builder.SetResourceQuota(quota);
  }
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || impl_->port == 0)
    throw Error(ErrorCode::kUnavailable, "serve: cannot listen for gRPC on " + host + ":" + std::to_string(options.port));
}

GrpcServer::~GrpcServer() { Shutdown(); }

int GrpcServer::port() const { return impl_->port; }

void GrpcServer::Shutdown() {
  if (impl_->shut_down) return;
  impl_->shut_down = true;
  // Calls still queued run (or see their cancellation) on the pool's workers while the server waits for them.
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(30));
  impl_->pool->Join();
}

}  // namespace osprey::serve
