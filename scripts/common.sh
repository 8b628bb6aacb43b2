# Shared set-up for scripts/demo, scripts/test and .ci/run (sourced, not executed).
# Installs the Debian packages the build needs when they are missing: with apt-get as root, else
# through sudo, else prints the exact command and fails.
set -euo pipefail

PAGEDKV_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PAGEDKV_JOBS="$(nproc 2>/dev/null || echo 2)"

# Debian packages: compiler and CMake, OpenSSL, xxHash (headers and the xxhsum tool used by the
# hash-vector test), GoogleTest, Google Benchmark, gnuplot for the replay plots, clang for the
# fuzzer; Python headers, pybind11, numpy and pytest for the Python module (python/); ZeroMQ
# (libzmq + cppzmq) and msgpack-cxx for pagedkv::events, and pyzmq + msgpack for the test that
# decodes its stream independently; hiredis for RedisStore (pagedkv::remote; DiskStore needs
# none), and the servers its tests start on 127.0.0.1 (redis-server, nutcracker = twemproxy) plus
# redis-tools for redis-benchmark;
# zlib for pagedkv-replay's gzip-compressed traces; Ninja, the build trees' generator (below).
PAGEDKV_PACKAGES=(cmake ninja-build g++ make libssl-dev libxxhash-dev xxhash libgtest-dev libgmock-dev
                  libbenchmark-dev gnuplot-nox clang libclang-rt-14-dev
                  python3-dev pybind11-dev python3-pybind11 python3-numpy python3-pytest
                  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev python3-zmq python3-msgpack
                  libhiredis-dev redis-server redis-tools nutcracker zlib1g-dev)

pagedkv_ensure_packages() {
  local missing=()
  local pkg
  for pkg in "${PAGEDKV_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$pkg")
  done
  command -v python3 >/dev/null 2>&1 || missing+=(python3)
  [ "${#missing[@]}" -eq 0 ] && return 0

  echo "pagedkv: installing missing Debian packages: ${missing[*]}"
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=(sudo)
    else
      echo "pagedkv: not root and no usable sudo; run this, then try again:" >&2
      echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
      exit 1
    fi
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
}

# pagedkv_generator BUILD_DIR: the generator arguments for a CMake build tree, one a line: "-G",
# "Ninja" for a new tree when ninja is installed, nothing otherwise (an existing tree keeps the
# generator it was made with: CMake refuses another). Ninja spends less CPU than make on its own
# bookkeeping and starts a target's compiles before the libraries it links are built, so two cores
# stay busy to the end. Use: mapfile -t gen < <(pagedkv_generator DIR); cmake "${gen[@]}" ...
pagedkv_generator() {
  if [ ! -f "$1/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then
    printf '%s\n' -G Ninja
  fi
}

# pagedkv_configure BUILD_DIR [cmake args...]
pagedkv_configure() {
  local dir="$1"
  shift
  local gen=()
  mapfile -t gen < <(pagedkv_generator "$dir")
  cmake -S "$PAGEDKV_ROOT" -B "$dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
}
