#pragma once
// What the recurrent ops (RNN, GRU, LSTM) read from a node, parsed and checked in one place so the schema
// (src/ops/recurrent.cc) and the reference kernel (src/kernels/reference/recurrent.cc) agree on it.
#include <cmath>
#include <string>
#include <vector>

#include "osprey/graph.h"

namespace osprey {

/// One activation of a recurrent cell (ONNX's list: Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu,
/// ScaledTanh, HardSigmoid, Elu, Softsign, Softplus), with its alpha/beta.
struct RecurrentActivation {
  enum class Kind {
    kRelu,
    kTanh,
    kSigmoid,
    kAffine,
    kLeakyRelu,
    kThresholdedRelu,
    kScaledTanh,
    kHardSigmoid,
    kElu,
    kSoftsign,
    kSoftplus
  };
  Kind kind = Kind::kTanh;
  float alpha = 0.f;
  float beta = 0.f;

  float Apply(float x) const {
    switch (kind) {
      case Kind::kRelu:
        return x > 0.f ? x : 0.f;
      case Kind::kTanh:
        return std::tanh(x);
      case Kind::kSigmoid:
        return 1.f / (1.f + std::exp(-x));
      case Kind::kAffine:
        return alpha * x + beta;
      case Kind::kLeakyRelu:
        return x >= 0.f ? x : alpha * x;
      case Kind::kThresholdedRelu:
        return x > alpha ? x : 0.f;
      case Kind::kScaledTanh:
        return alpha * std::tanh(beta * x);
      case Kind::kHardSigmoid:
        return std::fmin(std::fmax(alpha * x + beta, 0.f), 1.f);
      case Kind::kElu:
        return x >= 0.f ? x : alpha * (std::exp(x) - 1.f);
      case Kind::kSoftsign:
        return x / (1.f + std::fabs(x));
      case Kind::kSoftplus:
        return std::log1p(std::exp(-std::fabs(x))) + std::fmax(x, 0.f);
    }
    return x;
  }
};

/// The attributes of an RNN, GRU or LSTM node and the sizes its weights give.
struct RecurrentSpec {
  int gates = 1;                      // 1 (RNN), 3 (GRU: z, r, h), 4 (LSTM: i, o, f, c)
  int activations_per_direction = 1;  // 1 (RNN: f), 2 (GRU: f, g), 3 (LSTM: f, g, h)
  int num_directions = 1;
  bool reverse = false;              // direction "reverse" (with one direction)
  int64_t layout = 0;                // 0: X [seq, batch, input]; 1: X [batch, seq, input]
  float clip = 0.f;                  // > 0: gate inputs are clipped to [-clip, clip]
  bool linear_before_reset = false;  // GRU
  bool input_forget = false;         // LSTM: f = 1 - i
  /// num_directions * activations_per_direction activations, direction by direction.
  std::vector<RecurrentActivation> activations;
  const RecurrentActivation& Activation(int direction, int k) const {
    return activations[static_cast<size_t>(direction * activations_per_direction + k)];
  }
};

/// Parses and checks the attributes of `node` (op type RNN, GRU or LSTM); throws kInvalidArgument naming the node
/// and the attribute.
RecurrentSpec ParseRecurrentSpec(const Node& node);

}  // namespace osprey
