#pragma once
// Tensor-parallel slices as rectangles of the whole tensor, what a checkpoint's
// pieces are placed by (docs/checkpoint-format.md, "Parts"). A tensor is viewed as
// a matrix: [d0, d1 * d2 * ...] (a 1-D tensor [n] is [n, 1]). A tensor-parallel
// slice is a block of rows (shard_dim 0), a block of columns (shard_dim 1, 2-D
// tensors only) or the whole (-1); its local copy is that block, row-major. A Box
// is a rectangle of the global matrix.

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_error.h"
#include "model/model.h"

namespace hdp {

struct Box {
  int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
  int64_t width() const { return c1 - c0; }
  int64_t area() const { return (r1 - r0) * (c1 - c0); }
  bool empty() const { return r1 <= r0 || c1 <= c0; }
  bool intersects(const Box& o) const {
    return std::max(r0, o.r0) < std::min(r1, o.r1) && std::max(c0, o.c0) < std::min(c1, o.c1);
  }
  Box hull(const Box& o) const {
    if (empty()) return o;
    if (o.empty()) return *this;
    return {std::min(r0, o.r0), std::max(r1, o.r1), std::min(c0, o.c0), std::max(c1, o.c1)};
  }
};

struct Slice {
  std::vector<int64_t> global_shape;
  int shard_dim = -1;
  int64_t begin = 0, end = 0;

  int64_t global_rows() const { return global_shape.empty() ? 1 : global_shape[0]; }
  int64_t global_cols() const {
    int64_t n = 1;
    for (size_t i = 1; i < global_shape.size(); ++i) n *= global_shape[i];
    return n;
  }
  int64_t row0() const { return shard_dim == 0 ? begin : 0; }
  int64_t col0() const { return shard_dim == 1 ? begin : 0; }
  int64_t rows() const { return shard_dim == 0 ? end - begin : global_rows(); }
  int64_t cols() const { return shard_dim == 1 ? end - begin : global_cols(); }
  int64_t numel() const { return rows() * cols(); }
  std::vector<int64_t> local_shape() const {
    std::vector<int64_t> s = global_shape;
    if (shard_dim >= 0) s[shard_dim] = end - begin;
    return s;
  }
  Box box() const { return {row0(), row0() + rows(), col0(), col0() + cols()}; }
  // Empty string when the spec is consistent.
  std::string problem() const {
    if (global_shape.empty()) return "has no shape";
    for (int64_t d : global_shape) {
      if (d <= 0) return "has shape " + shape_text(global_shape);
    }
    if (shard_dim < -1 || shard_dim > 1 || (shard_dim == 1 && global_shape.size() != 2)) {
      return "has shard_dim " + std::to_string(shard_dim) + " for shape " + shape_text(global_shape);
    }
    if (shard_dim >= 0 && (begin < 0 || end <= begin || end > global_shape[shard_dim])) {
      return "has the slice [" + std::to_string(begin) + ", " + std::to_string(end) + ") of dimension " +
             std::to_string(shard_dim) + " of " + shape_text(global_shape);
    }
    return "";
  }

  // The rectangle holding local flat elements [start, start + count).
  Box range_box(int64_t start, int64_t count) const {
    if (count <= 0) return {};
    const int64_t w = cols();
    const int64_t first = start / w, last = (start + count - 1) / w;
    int64_t lo = 0, hi = w;
    if (first == last) {
      lo = start % w;
      hi = lo + count;
    }
    return {row0() + first, row0() + last + 1, col0() + lo, col0() + hi};
  }

  // Calls fn(local_index, box_index, n) for every run of n elements that are both
  // among local flat elements [start, start + count) and inside `box`.
  template <class Fn>
  void for_each_run(int64_t start, int64_t count, const Box& box, Fn&& fn) const {
    if (count <= 0) return;
    const int64_t w = cols();
    const int64_t first = std::max(start / w, box.r0 - row0());
    const int64_t last = std::min((start + count - 1) / w, box.r1 - 1 - row0());
    for (int64_t row = first; row <= last; ++row) {
      const int64_t g = row0() + row;
      if (g < box.r0 || g >= box.r1) continue;
      const int64_t lo = std::max(start, row * w) - row * w;
      const int64_t hi = std::min(start + count, (row + 1) * w) - row * w;
      const int64_t a = std::max(col0() + lo, box.c0), b = std::min(col0() + hi, box.c1);
      if (a < b) fn(row * w + (a - col0()), (g - box.r0) * box.width() + (a - box.c0), b - a);
    }
  }
};

// A parameter's slice as its rank holds it.
inline Slice slice_of(const ParameterInfo& p) {
  Slice s;
  s.global_shape = p.global_shape;
  s.shard_dim = p.shard_dim;
  s.begin = p.shard_dim >= 0 ? p.shard_begin : 0;
  s.end = p.shard_dim >= 0 ? p.shard_end : (p.global_shape.empty() ? 0 : p.global_shape[0]);
  return s;
}

}  // namespace hdp
