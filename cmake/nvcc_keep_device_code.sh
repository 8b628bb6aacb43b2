#!/usr/bin/env bash
# CUDA compiler launcher of PAGEDKV_CUDA_KEEP_DEVICE_CODE (CMakeLists.txt): runs the compile
# command it is given (nvcc ... -o OBJECT, possibly behind another launcher such as ccache, whose
# cache hits keep nothing: nvcc does not run) with
# nvcc's --resource-usage and --keep, and leaves beside the object a folder OBJECT.device/ that
# holds what scripts/kernel-resources needs, so that it reads the build's own device code instead
# of compiling every kernel source a second time:
#   command       the compile command, one argument per NUL-terminated field (without this launcher)
#   nvcc-version  `nvcc --version` of the compiler that ran
#   deps          the compile's dependency list (its -MF file: every header it read); without one
#                 kernel-resources compiles that source again
#   *.ptx         the PTX (the kernels' block sizes)
#   *.cubin       the real architecture's code (STEM.cubin or STEM.sm_XX.cubin; the SASS check)
#   ptxas.log     nvcc's whole output (ptxas's resource usage), written last: the folder is
#                 complete when ptxas.log is there and no older than the object
# The compiler's output is still printed, less ptxas's resource lines (hundreds of them, which
# the report shows). The folder is removed first, and again when the compile fails, so a failed or
# interrupted compile never leaves a complete-looking one. Exit status: the compiler's (keeping
# what it compiled can fail, a compile that passed cannot).
set -uo pipefail

obj=""
depfile=""
compiler=""
prev=""
for arg in "$@"; do
  [ "$prev" = "-o" ] && obj="$arg"
  [ "$prev" = "-MF" ] && depfile="$arg"
  # The compiler: the first argument named nvcc* (another launcher may come before it).
  if [ -z "$compiler" ]; then
    case "$(basename -- "$arg")" in
      nvcc*) compiler="$arg" ;;
    esac
  fi
  prev="$arg"
done
if [ -z "$obj" ] || [ -z "$compiler" ]; then
  exec "$@"
fi

dir="$obj.device"
rm -rf "$dir"
if ! mkdir -p "$dir" || ! printf '%s\0' "$@" >"$dir/command"; then
  echo "nvcc_keep_device_code: cannot write $dir: compiling without keeping the device code" >&2
  rm -rf "$dir"
  exec "$@"
fi
output="$("$@" --resource-usage --keep --keep-dir "$dir" 2>&1)"
rc=$?
# Everything but ptxas's resource report (its "ptxas info" lines and the stack-frame lines under
# them) reaches the build's log as the compiler printed it.
printf '%s\n' "$output" | grep -v -E '^ptxas info +:|^ +[0-9]+ bytes stack frame|^$' >&2
if [ "$rc" != 0 ]; then
  rm -rf "$dir"
  exit "$rc"
fi
# The host-side intermediates (preprocessed sources, several MB each) are not needed.
find "$dir" -maxdepth 1 -type f ! -name '*.ptx' ! -name '*.cubin' ! -name command -delete
# The dependency list (the build tool reads, then may delete, the original after this returns),
# the compiler's version, and last the log. The object is good whatever happens here: a folder
# that cannot be completed is removed (the report then compiles that source), never a failed build.
# No cubin (a launcher in front, such as ccache, answered from its cache and nvcc did not run):
# nothing to keep.
if compgen -G "$dir/*.cubin" >/dev/null &&
   { [ -z "$depfile" ] || [ ! -f "$depfile" ] || cp -- "$depfile" "$dir/deps"; } &&
   "$compiler" --version >"$dir/nvcc-version" 2>/dev/null &&
   printf '%s\n' "$output" >"$dir/ptxas.log.tmp" && mv "$dir/ptxas.log.tmp" "$dir/ptxas.log"; then
  exit 0
fi
echo "nvcc_keep_device_code: could not complete $dir (removed; the object is kept)" >&2
rm -rf "$dir"
exit 0
