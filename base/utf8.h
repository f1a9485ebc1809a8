#pragma once
// UTF-8 validation (RFC 3629: no overlong forms, no UTF-16 surrogates, nothing
// past U+10FFFF), a byte at a time so that text read in blocks is checked across
// their boundaries. Used where the project reads text: configs (base/yaml_reader)
// and prepare-data's inputs (data/prepare).

#include <cstdint>

namespace hdp {

class Utf8Checker {
 public:
  // Takes the byte at `offset` of the text. Returns how many invalid sequences it
  // ends: 0; 1 for a byte that cannot start a sequence (a stray continuation byte,
  // or a lead byte UTF-8 never uses) or for a sequence it cuts short (this byte
  // then starts afresh); 2 when both.
  int next(unsigned char b, int64_t offset) {
    int invalid = 0;
    if (expected_ > 0) {
      if (b >= lo_ && b <= hi_) {
        --expected_;
        lo_ = 0x80;
        hi_ = 0xBF;
        return 0;
      }
      invalid += found(start_);
    }
    if (b < 0x80) return invalid;
    start_ = offset;
    lo_ = 0x80;
    hi_ = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      expected_ = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      expected_ = 2;
      if (b == 0xE0) lo_ = 0xA0;  // no overlong forms
      if (b == 0xED) hi_ = 0x9F;  // no surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      expected_ = 3;
      if (b == 0xF0) lo_ = 0x90;  // no overlong forms
      if (b == 0xF4) hi_ = 0x8F;  // nothing past U+10FFFF
    } else {
      invalid += found(offset);
    }
    return invalid;
  }

  // At the end of the text: 1 when it cuts a sequence short.
  int finish() { return expected_ > 0 ? found(start_) : 0; }

  // The offset where the first invalid sequence starts; -1 while there is none.
  int64_t first_invalid() const { return first_; }

 private:
  int found(int64_t at) {
    if (first_ < 0) first_ = at;
    expected_ = 0;
    return 1;
  }

  int expected_ = 0;                     // continuation bytes still due
  unsigned char lo_ = 0x80, hi_ = 0xBF;  // the range of the next one
  int64_t start_ = 0;                    // where the sequence in progress starts
  int64_t first_ = -1;
};

}  // namespace hdp
