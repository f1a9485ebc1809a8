#!/usr/bin/env bash
# The relocatable bundle (scripts/bundle.sh), packed into its archive under the GPU
# machines' size limit and unpacked elsewhere, runs from there with a clean
# environment (no LD_LIBRARY_PATH but the bundle's): `trainer --version`, a
# 5-step tiny-llama on one rank, and the same on two ranks through the bundle's own
# mpirun (hybrid data parallel), whose losses must equal the single rank's within
# 1e-5 relative. Every library the trainer loads, other than glibc's and CUDA's,
# must resolve inside the bundle.
#   tests/bundle_test.sh TRAINER_BINARY
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
trainer="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The bundle travels as its archive (a lent GPU machine takes 64 MiB with the working
# tree): packed at gzip's fast level 1 here, which bounds the level-9 archive
# bench/gpu_prepare.sh makes, checked against the limit, and unpacked to run from.
bash "$root/scripts/bundle.sh" --archive "$work/bundle.tar.gz" --level 1 "$work/packed/bundle" "$trainer" \
  > "$work/bundle.log" 2>&1 || { cat "$work/bundle.log"; exit 1; }
grep 'archive:' "$work/bundle.log"
cd "$work"
tar -xzf bundle.tar.gz
clean=(env -i HOME="$work" PATH=/usr/bin:/bin OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
       OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_rmaps_base_oversubscribe=1)

# Which files the dynamic loader picks with the bundle's library path.
source bundle/lib/bundle-env.sh
outside="$(ldd bundle/bin/trainer | awk '/=>/ {print $3}' | grep -v "^$work/bundle/" |
  grep -Ev '/(libc|libm|libmvec|libpthread|libdl|librt|libresolv|ld-linux[^/]*|libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn[a-z0-9_]*|libstdc\+\+|libgcc_s)\.so' || true)"
if [ -n "$outside" ]; then
  echo "bundle_test: libraries resolved outside the bundle:"; echo "$outside"; exit 1
fi

version="$("${clean[@]}" bundle/run.sh --version)"
[[ "$version" == trainer\ * ]] || { echo "bundle_test: --version printed '$version'"; exit 1; }

"${clean[@]}" bundle/run.sh make-corpus --output data/corpus.h5 --documents 400 > make-corpus.log 2>&1
args=(train "$root/configs/tiny-llama.yaml" --set data.path=data/corpus.h5 --set train.steps=5
      --set train.log_every=1 --set train.checkpoint_every=0 --set train.resume=never --set train.threads=1)
"${clean[@]}" bundle/run.sh "${args[@]}" --set train.run_dir=one > one.log 2>&1 || { tail -5 one.log; exit 1; }
"${clean[@]}" bundle/mpirun.sh -np 2 bundle/run.sh "${args[@]}" --set parallel.hdp=2 --set train.run_dir=two \
  > two.log 2>&1 || { tail -5 two.log; exit 1; }

losses() { grep -o '"loss": *[0-9.e+-]*' "$1" | sed 's/.*: *//'; }
paste <(losses one/metrics.jsonl) <(losses two/metrics.jsonl) |
  awk '{r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > m) m = r; n++}
       END {printf "bundle_test: %d steps, one rank vs two ranks: max relative difference %.2e\n", n, m;
            exit (n == 5 && m <= 1e-5) ? 0 : 1}'
