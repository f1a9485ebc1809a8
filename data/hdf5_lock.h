#pragma once
// The HDF5 library Debian ships is built without its thread-safety option, so
// every sequence of HDF5 calls in the process (datasets here, checkpoints in the
// trainer) must hold one process-wide mutex. Take it with Hdf5Lock, which also
// turns off HDF5's automatic printing of its error stack (errors become
// exceptions instead; see data/hdf5_util.h).
//
// The mutex is not recursive: a function holding it must not call another
// function of this library that takes it again (public functions of
// TokenDataset / TokenDatasetWriter take it themselves).

#include <mutex>

namespace hdp {

// The one mutex guarding all HDF5 calls of the process.
std::mutex& hdf5_mutex();

// Disables HDF5's automatic error-stack printing to stderr (H5Eset_auto2 with
// a null handler). Idempotent and cheap; call with hdf5_mutex() held.
void hdf5_silence_errors();

// Turns off HDF5's clean-up at process exit (H5dont_atexit); call first thing in
// main, before any HDF5 call. After a write fails (a full disk, a file size limit)
// HDF5 1.10's failed close leaves the file half destroyed, and that clean-up then
// crashes the exiting process (SIGSEGV in H5F__close_cb) after it reported the
// error; every file the project opens it also closes itself.
void hdf5_skip_exit_cleanup();

// RAII: locks hdf5_mutex() and makes sure error printing is silenced.
class Hdf5Lock {
 public:
  Hdf5Lock() : lock_(hdf5_mutex()) { hdf5_silence_errors(); }
  Hdf5Lock(const Hdf5Lock&) = delete;
  Hdf5Lock& operator=(const Hdf5Lock&) = delete;

 private:
  std::lock_guard<std::mutex> lock_;
};

}  // namespace hdp
