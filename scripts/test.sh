#!/usr/bin/env bash
# The test command (README, .ci/run): installs what is missing, builds, runs the torch-free
# libraries' tests under ASan+UBSan, then every test with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

# Sanitizers on what does not link LibTorch (Debian's LibTorch is not built for ASan).
FLASHDRAFT_BUILD_DIR=build-asan FLASHDRAFT_TARGETS="flashdraft_common_test flashdraft_coordinator_test" \
  scripts/build.sh -DFLASHDRAFT_SANITIZE=ON -DFLASHDRAFT_BUILD_BENCH=OFF
for t in flashdraft_common_test flashdraft_coordinator_test; do
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 "build-asan/bin/$t" --gtest_brief=1
done

scripts/build.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
cd build && ctest --output-on-failure --timeout 900 -j 2
