#include "serve/multipart.h"

#include <cctype>

#include "osprey/error.h"

namespace osprey::serve {
namespace {

Error Malformed(const std::string& message) {
  return Error(ErrorCode::kInvalidArgument, "malformed multipart body: " + message);
}

bool EqualsNoCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The value of parameter `key` in "type; k1=v1; k2=\"v2\"" (quotes removed, no escapes), or empty; `found` says whether
// the parameter was there. A quoted value runs to the next quote, so ';' inside quotes does not split.
std::string_view HeaderParameter(std::string_view header, std::string_view key, bool* found) {
  *found = false;
  size_t i = header.find(';');
  while (i != std::string_view::npos && i < header.size()) {
    ++i;  // past ';'
    while (i < header.size() && (header[i] == ' ' || header[i] == '\t')) ++i;
    const size_t eq = header.find('=', i);
    if (eq == std::string_view::npos) return {};
    const std::string_view name = Trim(header.substr(i, eq - i));
    size_t v = eq + 1;
    while (v < header.size() && (header[v] == ' ' || header[v] == '\t')) ++v;
    std::string_view value;
    size_t next;
    if (v < header.size() && header[v] == '"') {
      const size_t close = header.find('"', v + 1);
      if (close == std::string_view::npos)
        throw Malformed("unterminated quoted value in '" + std::string(header) + "'");
      value = header.substr(v + 1, close - v - 1);
      next = header.find(';', close);
    } else {
      next = header.find(';', v);
      value = Trim(header.substr(v, next == std::string_view::npos ? std::string_view::npos : next - v));
    }
    if (EqualsNoCase(name, key)) {
      *found = true;
      return value;
    }
    i = next;
  }
  return {};
}

}  // namespace

bool IsMultipart(std::string_view content_type) {
  constexpr std::string_view kPrefix = "multipart/";
  return content_type.size() >= kPrefix.size() && EqualsNoCase(content_type.substr(0, kPrefix.size()), kPrefix);
}

std::string MultipartBoundary(std::string_view content_type) {
  bool found = false;
  const std::string_view boundary = HeaderParameter(content_type, "boundary", &found);
  if (!found) throw Malformed("Content-Type '" + std::string(content_type) + "' has no boundary parameter");
  if (boundary.empty() || boundary.size() > 70)
    throw Malformed("boundary must be 1..70 characters, found " + std::to_string(boundary.size()));
  return std::string(boundary);
}

std::vector<MultipartPart> ParseMultipart(std::string_view body, std::string_view boundary, size_t max_parts) {
  if (boundary.empty()) throw Malformed("empty boundary");
  // Delimiters are "--boundary" at the very start of the body or after CRLF; text before the first is a preamble.
  std::string delimiter = "\r\n--";
  delimiter.append(boundary);
  size_t pos;
  if (body.substr(0, delimiter.size() - 2) == std::string_view(delimiter).substr(2)) {
    pos = delimiter.size() - 2;
  } else {
    const size_t first = body.find(delimiter);
    if (first == std::string_view::npos) throw Malformed("the boundary '" + std::string(boundary) + "' never occurs");
    pos = first + delimiter.size();
  }
  std::vector<MultipartPart> parts;
  for (;;) {
    // After a delimiter: "--" closes the body; otherwise optional whitespace then CRLF starts a part.
    if (body.substr(pos, 2) == "--") {
      if (parts.empty()) throw Malformed("no parts before the closing delimiter");
      return parts;  // the epilogue is ignored
    }
    while (pos < body.size() && (body[pos] == ' ' || body[pos] == '\t')) ++pos;
    if (body.substr(pos, 2) != "\r\n")
      throw Malformed("expected CRLF after the delimiter at byte " + std::to_string(pos));
    pos += 2;
    if (parts.size() == max_parts) throw Malformed("more than " + std::to_string(max_parts) + " parts");

    MultipartPart part;
    // Headers: lines until an empty line.
    for (;;) {
      const size_t eol = body.find("\r\n", pos);
      if (eol == std::string_view::npos)
        throw Malformed("headers of part " + std::to_string(parts.size() + 1) + " do not end");
      const std::string_view line = body.substr(pos, eol - pos);
      pos = eol + 2;
      if (line.empty()) break;
      const size_t colon = line.find(':');
      if (colon == std::string_view::npos)
        throw Malformed("part " + std::to_string(parts.size() + 1) + ": header line without ':'");
      const std::string_view name = Trim(line.substr(0, colon));
      const std::string_view value = Trim(line.substr(colon + 1));
      if (EqualsNoCase(name, "Content-Disposition")) {
        bool found = false;
        part.name = HeaderParameter(value, "name", &found);
        part.filename = HeaderParameter(value, "filename", &found);
      } else if (EqualsNoCase(name, "Content-Type")) {
        part.content_type = value;
      }
    }
    const size_t end = body.find(delimiter, pos - 2);  // an empty part's delimiter CRLF is the headers' last CRLF
    if (end == std::string_view::npos)
      throw Malformed("part " + std::to_string(parts.size() + 1) + " is not terminated by the boundary");
    part.data = end >= pos ? body.substr(pos, end - pos) : std::string_view();
    parts.push_back(part);
    pos = end + delimiter.size();
  }
}

}  // namespace osprey::serve
