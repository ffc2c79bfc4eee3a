# Sourced by scripts/demo, scripts/test, scripts/fuzz and scripts/bench: bootstraps, then sets
# CMAKE and CTEST; `caller` is the directory the script was started from (for relative paths in
# its arguments), and the script itself runs from the repository's root.
set -euo pipefail
caller=$PWD
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash "$root/scripts/bootstrap"
CMAKE=$(cat "$root/.tools/cmake-path")
CTEST="$(dirname "$CMAKE")/ctest"
# A compiler chosen by the caller (CXX=g++-14 ...) overrides the presets' clang-19 — if it can
# build named modules at all: a CXX exported for other work (Debian 12's g++ is 12) would fail
# later, deep in the build, with nothing saying why.
compiler_args=()
if [ -n "${CXX:-}" ]; then
  cxx_version=$("$CXX" --version 2>/dev/null | head -n1 || true)
  cxx_major=$("$CXX" -dumpversion 2>/dev/null | cut -d. -f1 || true)
  cxx_min=14
  [[ "$cxx_version" == *clang* ]] && cxx_min=17
  if [ "${cxx_major:-0}" -lt "$cxx_min" ]; then
    echo "CXX=$CXX (${cxx_version:-not found}) cannot build C++20 named modules: it takes" \
         "clang >= 17 or GCC >= 14; unset CXX to use the presets' clang++-19" >&2
    exit 1
  fi
  compiler_args=(-DCMAKE_CXX_COMPILER="$CXX")
fi
configure() { # configure PRESET
  "$CMAKE" --preset "$1" "${compiler_args[@]}" >/dev/null
}
quiet_build() { # quiet_build ARGS...: cmake --build ARGS, its output shown only if it fails
  local log
  log=$(mktemp)
  if ! "$CMAKE" --build "$@" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "build failed: cmake --build $*" >&2
    return 1
  fi
  rm -f "$log"
}
# Whether the configured compiler is clang (libFuzzer, the fuzz preset, needs it).
compiler_is_clang() { [[ "$("${CXX:-clang++-19}" --version 2>/dev/null | head -n1)" == *clang* ]]; }
