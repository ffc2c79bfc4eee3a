# Sourced by scripts/demo, scripts/test and scripts/bench: bootstraps, then sets CMAKE and CTEST.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash "$root/scripts/bootstrap"
CMAKE=$(cat "$root/.tools/cmake-path")
CTEST="$(dirname "$CMAKE")/ctest"
# A compiler chosen by the caller (CXX=g++-14 ...) overrides the presets' clang-19.
compiler_args=()
[ -n "${CXX:-}" ] && compiler_args=(-DCMAKE_CXX_COMPILER="$CXX")
configure() { # configure PRESET
  "$CMAKE" --preset "$1" "${compiler_args[@]}" >/dev/null
}
