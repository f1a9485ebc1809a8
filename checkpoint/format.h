#pragma once
// The on-disk format of a checkpoint's parts (docs/checkpoint-format.md, "Parts"
// and "Checksum"): one HDF5 file per rank holding, as pieces placed in the whole
// tensors, its tensor-parallel slice of the weights it writes and its ZeRO-1 shard
// of the AdamW moments, every dataset with a checksum. Writing one rank's part, and
// reading a committed checkpoint: an index of the pieces every part holds, from
// which any rectangle of any tensor is assembled, whatever layout wrote it.
// Every function here that touches HDF5 expects the caller to hold Hdf5Lock
// (data/hdf5_lock.h), except write_part, which takes it.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/tensor_slice.h"
#include "data/hdf5_util.h"
#include "kernels/allocator.h"
#include "model/model.h"
#include "parallel/communicator.h"
#include "parallel/zero_optimizer.h"
#include "spec/parallel_degrees.h"

namespace hdp {

// Where this rank sits when it writes its part.
struct CheckpointLayout {
  ParallelDegrees degrees;
  GridCoords coords;
  int world_rank = 0;
  Communicator* world = nullptr;  // save synchronises over it (two all-reduces); nullptr = offline (checkpoint/protocol.h)
};

// What one rank's part holds, copied to host memory at a step boundary, so that
// the part can be written while training goes on (asynchronous checkpoints,
// checkpoint/writer.h): the parameters' layout and this rank's slice of their
// values (only when it writes weights: hdp rank 0), its ZeRO-1 segments and
// moment shards, and the progress. Its buffers are reused by the next snapshot, and
// are page-locked when the state is on a GPU (so the copies run at full bandwidth).
struct CheckpointSnapshot {
  std::vector<ParameterInfo> parameters;
  std::vector<ZeroAdamW::Segment> segments;
  HostBuffer flat_parameters;  // empty unless this rank writes weights
  HostBuffer exp_avg, exp_avg_sq;
  TrainingProgress progress;
};

// The datasets of the two moments: exp_avg.<start>, exp_avg_sq.<start>.
inline constexpr const char* kMomentNames[2] = {"exp_avg", "exp_avg_sq"};

// rank-00005.h5: the part of world rank 5.
std::string part_name(int world_rank);

// Whether this rank's part holds weights: one copy of every weight is written, by
// the first rank of the data-parallel group that holds its slice (write_part says
// which weights).
bool part_holds_weights(const CheckpointLayout& layout);

// Writes this rank's part to `file`, through file.tmp and a rename; CheckpointError
// naming the file when it fails. `before_create` (a test knob, may be empty) runs
// with file.tmp's path before the file is created.
void write_part(const std::string& file, const CheckpointSnapshot& snapshot, const CheckpointLayout& layout,
                const std::function<void(const std::string& file)>& before_create);

// A float32 dataset of this shape with its checksum attribute.
H5Handle write_dataset(hid_t loc, const std::string& name, const std::vector<int64_t>& shape, const float* data,
                       size_t count);

// Where a piece of a tensor is stored.
struct Piece {
  size_t part = 0;
  std::string dataset;  // path inside the part
  Slice slice;
  int64_t start = 0, length = 0;  // local flat elements [start, start + length) of the slice
};

struct TensorPieces {
  std::vector<Piece> weights;
  std::vector<Piece> moments[2];  // exp_avg, exp_avg_sq
};

// A committed checkpoint opened for reading: its manifest and an index of which
// part holds which piece of which tensor. Errors are CheckpointErrors naming the
// file and the tensor.
class CheckpointReader {
 public:
  // The caller holds Hdf5Lock for the reader's whole life.
  explicit CheckpointReader(const std::string& path);

  const Manifest& manifest() const { return manifest_; }
  // The tensors in the order first seen, parts in rank order.
  const std::vector<std::string>& tensor_names() const { return order_; }
  const TensorPieces* find(const std::string& name) const;

  // Checks that every stored piece of `name` has this global shape.
  void check_shape(const std::string& name, const TensorPieces& t, const std::vector<int64_t>& global_shape) const;

  // The box of the global tensor, assembled from every piece that meets it;
  // `count` says how many pieces covered each element (at most 2: twice is too many).
  struct Assembled {
    std::vector<float> data;
    std::vector<uint8_t> count;
  };
  Assembled assemble(const std::string& name, const std::vector<Piece>& pieces, const Box& box);

  // Throws unless every element in [at, at + n) of the box was stored exactly once.
  void check_covered(const Assembled& a, const Box& box, int64_t at, int64_t n, const std::string& what) const;

 private:
  template <class Fn>
  void in_file(size_t part, Fn&& fn);
  hid_t file(size_t part);
  TensorPieces& entry(const std::string& name);
  [[noreturn]] void bad(size_t part, const std::string& msg) const;
  void index_part(size_t part);
  std::vector<float> read_piece(const std::string& name, const Piece& p);

  std::string path_;
  Manifest manifest_;
  std::vector<std::string> files_;
  std::vector<H5Handle> handles_;
  std::vector<int64_t> versions_;  // each part's format_version (which checksum it holds)
  std::map<std::string, TensorPieces> index_;
  std::vector<std::string> order_;  // first seen, parts in rank order
};

}  // namespace hdp
