#include <set>
#include <sstream>

#include "osprey/graph.h"

namespace osprey {

void Graph::Validate() const {
  const int nv = num_values();
  std::vector<char> defined(nv, 0);
  auto bad = [&](const std::string& msg) { throw Error(ErrorCode::kInvalidArgument, "graph '" + name + "': " + msg); };
  if (inputs.size() != input_infos.size()) bad("inputs and input_infos differ in length");
  for (int id : inputs) {
    if (id < 0 || id >= nv) bad("graph input id out of range");
    if (defined[id]) bad("value '" + value_names[id] + "' is a graph input twice");
    defined[id] = 1;
  }
  for (const auto& [id, t] : constants) {
    if (id < 0 || id >= nv) bad("constant id out of range");
    defined[id] = 1;
  }
  for (const Node& n : nodes) {
    for (int v : n.inputs) {
      if (v < -1 || v >= nv) bad(n.Describe() + ": input id out of range");
      if (v >= 0 && !defined[v])
        bad(n.Describe() + ": input '" + value_names[v] + "' is not produced before use (graph not topologically "
            "sorted, or the value is missing)");
    }
    for (int v : n.outputs) {
      if (v < 0 || v >= nv) bad(n.Describe() + ": output id out of range");
      if (defined[v]) bad(n.Describe() + ": output '" + value_names[v] + "' already has a producer");
      defined[v] = 1;
    }
  }
  if (outputs.empty()) bad("graph has no outputs");
  for (int id : outputs) {
    if (id < 0 || id >= nv) bad("graph output id out of range");
    if (!defined[id]) bad("graph output '" + value_names[id] + "' is never produced");
  }
}

}  // namespace osprey
