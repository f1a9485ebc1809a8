# Sourced by the GPU scripts of bench/ (not run): finds CUDA's runtime libraries
# (cudart, cuBLAS(Lt), cuDNN, NCCL) on a GPU machine, in the system's library path
# or else in a PyTorch installation's nvidia-* wheels, puts them on LD_LIBRARY_PATH
# and sets `cuda_dirs` to what it added (empty: the system's). Also lets OpenMPI
# run as root and oversubscribe, as the lent GPU machines need.
cuda_dirs=""
if ! ldconfig -p | grep -q 'libcublasLt.so.13'; then
  for lib in libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libnccl.so.2 libcudnn.so.9; do
    d="$(find / \( -path /proc -o -path /sys \) -prune -o -name "$lib" -print 2>/dev/null | head -1 | xargs -r dirname)"
    [ -n "$d" ] && case ":$cuda_dirs:" in *":$d:"*) ;; *) cuda_dirs="${cuda_dirs:+$cuda_dirs:}$d" ;; esac
  done
fi
export LD_LIBRARY_PATH="${cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
