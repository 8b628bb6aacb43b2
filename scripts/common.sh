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

# pagedkv_nvdisasm: prints the path of an nvdisasm for scripts/kernel-resources' SASS check, or
# nothing when none can be had (the check then reports itself as not run). One on PATH or beside
# nvcc first; else Debian's: the CUDA 13 toolkit here has no disassembler, and bookworm's non-free
# component has nvidia-cuda-toolkit 11.8, whose nvdisasm reads CUDA 13's sm_90 / sm_90a code once
# the cubin's ELF header is given the CUDA 11 form (scripts/kernel-resources, old_abi_cubin). The
# package (84 MB) is downloaded, not installed, with a private package list (the system's sources
# are not touched), and only usr/bin/nvdisasm is unpacked, once, into build/tools/.
pagedkv_nvdisasm() {
  local found
  found="$(command -v nvdisasm 2>/dev/null || true)"
  [ -z "$found" ] && [ -x /usr/local/cuda/bin/nvdisasm ] && found=/usr/local/cuda/bin/nvdisasm
  local cached="$PAGEDKV_ROOT/build/tools/nvdisasm"
  [ -z "$found" ] && [ -x "$cached" ] && found="$cached"
  if [ -n "$found" ]; then
    echo "$found"
    return 0
  fi
  local tmp
  tmp="$(mktemp -d)" || return 0
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/parts"
  printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" "Suites: bookworm" \
    "Components: non-free" "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" \
    >"$tmp/parts/non-free.sources"
  # Read after the system's configuration (apt-get -c): its own sources, lists and caches, and
  # none of the system's update hooks (APT::Update::Post-Invoke* would run as root otherwise).
  printf '%s\n' "#clear APT::Update::Pre-Invoke;" "#clear APT::Update::Post-Invoke;" \
    "#clear APT::Update::Post-Invoke-Success;" "Dir::Etc::SourceList \"/dev/null\";" \
    "Dir::Etc::SourceParts \"$tmp/parts\";" "Dir::State::Lists \"$tmp/lists\";" \
    "Dir::Cache \"$tmp/cache\";" "Dir::Cache::pkgcache \"\";" "Dir::Cache::srcpkgcache \"\";" \
    "Acquire::http::Timeout \"30\";" >"$tmp/apt.conf"
  # (The subshell records the step that failed in $tmp/step for the message below.)
  if (step=update && cd "$tmp" && timeout 120 apt-get -c "$tmp/apt.conf" -qq update >"$tmp/log" 2>&1 &&
      step=download && timeout 300 apt-get -c "$tmp/apt.conf" -qq download \
        nvidia-cuda-toolkit >>"$tmp/log" 2>&1 &&
      step=unpack && dpkg-deb --fsys-tarfile nvidia-cuda-toolkit_*.deb |
        tar -x -C "$tmp" ./usr/bin/nvdisasm >>"$tmp/log" 2>&1 &&
      step=check && "$tmp/usr/bin/nvdisasm" --version >>"$tmp/log" 2>&1 ||
      { echo "$step" >"$tmp/step"; false; }); then
    # Copied beside its final name, then renamed: a concurrent build never runs half a file.
    mkdir -p "$(dirname "$cached")"
    cp "$tmp/usr/bin/nvdisasm" "$cached.$$" && mv -f "$cached.$$" "$cached" && echo "$cached"
  else
    echo "pagedkv: no nvdisasm (Debian's nvidia-cuda-toolkit: $(cat "$tmp/step" 2>/dev/null) failed: $(tail -n 1 "$tmp/log" 2>/dev/null)); the SASS check will not run" >&2
  fi
  rm -rf "$tmp"
}
