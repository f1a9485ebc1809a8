# shellcheck shell=bash
# Sourced by the GPU scripts of bench/ (not run): finds CUDA's runtime libraries
# (cudart, cuBLAS(Lt), cuDNN, NCCL) on a GPU machine, in the system's library path
# or else in a PyTorch installation's nvidia-* wheels, puts them on LD_LIBRARY_PATH
# and sets `cuda_dirs` to what it added (empty: the system's) and
# `system_ld_library_path` to the path as it was before (for programs such as
# PyTorch that bring their own CUDA libraries). Also lets OpenMPI run as root and
# oversubscribe, as the lent GPU machines need.
system_ld_library_path="${LD_LIBRARY_PATH:-}"
cuda_dirs=""
# ldconfig's cache read once into a variable: `ldconfig -p | grep -q` would end
# ldconfig early with SIGPIPE, a 141 that pipefail turns into "not found".
ld_cache="$(ldconfig -p 2>/dev/null)"
cuda_missing=()
for lib in libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libnccl.so.2 libcudnn.so.9; do
  [[ "$ld_cache" == *"$lib ("* ]] || cuda_missing+=("$lib")
done
if [ ${#cuda_missing[@]} -gt 0 ]; then
  # One find over where the image keeps CUDA (a toolkit under /usr/local or /opt, the
  # distribution's /usr/lib, PyTorch's nvidia-* wheels in python3's site-packages):
  # a find per library over all of / takes minutes on the image.
  cuda_roots=()
  for d in /opt /usr/local /usr/lib $(python3 -c 'import site; print(*site.getsitepackages())' 2>/dev/null); do
    [ -d "$d" ] && cuda_roots+=("$d")
  done
  cuda_names=()
  for lib in "${cuda_missing[@]}"; do cuda_names+=(${cuda_names[@]:+-o} -name "$lib"); done
  cuda_found="$(find "${cuda_roots[@]}" \( "${cuda_names[@]}" \) -print 2>/dev/null)"
  for lib in "${cuda_missing[@]}"; do
    d="$(grep -m1 "/$lib\$" <<< "$cuda_found")"
    d="${d%/*}"
    [ -n "$d" ] && case ":$cuda_dirs:" in *":$d:"*) ;; *) cuda_dirs="${cuda_dirs:+$cuda_dirs:}$d" ;; esac
  done
  unset cuda_roots cuda_names cuda_found d
fi
unset ld_cache cuda_missing lib
if [ -n "$cuda_dirs" ]; then export LD_LIBRARY_PATH="$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
