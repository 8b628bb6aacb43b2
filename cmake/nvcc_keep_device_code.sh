#!/usr/bin/env bash
# CUDA compiler launcher of PAGEDKV_CUDA_KEEP_DEVICE_CODE (CMakeLists.txt): runs the compile
# command it is given (nvcc ... -o OBJECT) with nvcc's --resource-usage and --keep, and leaves
# beside the object a folder OBJECT.device/ that holds what scripts/kernel-resources needs, so that
# it reads the build's own device code instead of compiling every kernel source a second time:
#   command      the compile command, one argument per NUL-terminated field (without this launcher)
#   *.ptx        the PTX (the kernels' block sizes)
#   *.sm_XX.cubin  each real architecture's code (the SASS check disassembles it)
#   ptxas.log    nvcc's whole output (ptxas's resource usage), written last: the folder is
#                complete when ptxas.log is there and no older than the object
# The compiler's output is still printed, less ptxas's resource lines (hundreds of them, which
# the report shows). The folder is removed first, and again when the compile fails, so a failed or
# interrupted compile never leaves a complete-looking one. Exit status: the compiler's.
set -uo pipefail

obj=""
prev=""
for arg in "$@"; do
  [ "$prev" = "-o" ] && obj="$arg"
  prev="$arg"
done
if [ -z "$obj" ]; then
  exec "$@"
fi

dir="$obj.device"
rm -rf "$dir"
if ! mkdir -p "$dir"; then
  echo "nvcc_keep_device_code: cannot create $dir" >&2
  exit 1
fi
printf '%s\0' "$@" >"$dir/command"
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
if ! printf '%s\n' "$output" >"$dir/ptxas.log.tmp" || ! mv "$dir/ptxas.log.tmp" "$dir/ptxas.log"; then
  echo "nvcc_keep_device_code: cannot write $dir/ptxas.log" >&2
  rm -rf "$dir"
  exit 1
fi
exit 0
