#pragma once
// multipart/form-data bodies (RFC 7578 over RFC 2046) for the classify endpoint (internal to the server). The parser
// only slices the body: parts are views into it, so nothing is allocated beyond the part list. Every function throws
// Error kInvalidArgument saying what is wrong.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace osprey::serve {

/// One part of a multipart body; the views point into the body given to ParseMultipart.
struct MultipartPart {
  std::string_view name;          // Content-Disposition name="..." (empty when absent)
  std::string_view filename;      // Content-Disposition filename="..." (empty when absent)
  std::string_view content_type;  // the part's Content-Type header value (empty when absent)
  std::string_view data;          // the part's content
};

/// True when `content_type` (any case) is multipart/form-data (or another multipart/* type).
bool IsMultipart(std::string_view content_type);
/// The boundary parameter of a multipart Content-Type (quoted or not), checked to be 1..70 characters.
std::string MultipartBoundary(std::string_view content_type);
/// Splits `body` into its parts. Refuses a body without a first delimiter, with no parts, with more than `max_parts`
/// parts, with a part whose headers do not end, or without the closing delimiter.
std::vector<MultipartPart> ParseMultipart(std::string_view body, std::string_view boundary, size_t max_parts = 256);

}  // namespace osprey::serve
