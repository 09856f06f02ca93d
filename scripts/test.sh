#!/usr/bin/env bash
# The test command (README, .ci/run): installs what is missing, builds, runs the torch-free
# libraries' tests under ASan+UBSan, fuzzes the parsers for a bounded time, then every test with
# ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests

# Sanitizers on what does not link LibTorch (Debian's LibTorch is not built for ASan).
SANITIZED="flashdraft_common_test flashdraft_coordinator_test flashdraft_cli_test flashdraft_pve_test
flashdraft_feeder_test"
FLASHDRAFT_BUILD_DIR=build-asan FLASHDRAFT_TARGETS="$SANITIZED" \
  scripts/build.sh -DFLASHDRAFT_SANITIZE=ON -DFLASHDRAFT_BUILD_BENCH=OFF
for t in $SANITIZED; do
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 "build-asan/bin/$t" --gtest_brief=1
done

# Every parser of untrusted input under libFuzzer for a bounded time each (clang; the corpus holds
# seeds and regression inputs; new inputs go to a scratch folder, never into the repository).
FUZZERS="chat_line checkpoint feed_message job_config safetensors tensor_chunk tokenizer"
FLASHDRAFT_BUILD_DIR=build-fuzz CXX=clang++ \
  FLASHDRAFT_TARGETS="$(printf 'fuzz_%s ' $FUZZERS)" \
  scripts/build.sh -DFLASHDRAFT_FUZZ=ON -DFLASHDRAFT_BUILD_BENCH=OFF
for f in $FUZZERS; do
  scratch=$(mktemp -d)
  if ! build-fuzz/bin/fuzz_$f -max_total_time="${FLASHDRAFT_FUZZ_SECONDS:-30}" -timeout=10 \
      -rss_limit_mb=2048 -artifact_prefix=build-fuzz/finding-$f- "$scratch" tests/fuzz/corpus/$f \
      >build-fuzz/fuzz_$f.log 2>&1; then
    tail -40 build-fuzz/fuzz_$f.log
    echo "fuzz_$f: a finding (build-fuzz/finding-$f-*); fix it and add the input to tests/fuzz/corpus/$f/"
    exit 1
  fi
  echo "fuzz_$f: $(grep -o 'Done [0-9]* runs' build-fuzz/fuzz_$f.log || echo 'ran') without findings"
  rm -rf "$scratch"
done

# ThreadSanitizer (docs/TESTING.md): every target built with -fsanitize=thread; the torch-free unit
# tests and the multi-process tests that fit the budget run with zero reports allowed. A report
# anywhere, in any process a test starts, lands in build-tsan/reports/ and fails the job.
FLASHDRAFT_BUILD_DIR=build-tsan scripts/build.sh -DFLASHDRAFT_TSAN=ON -DFLASHDRAFT_BUILD_BENCH=OFF
rm -rf build-tsan/reports && mkdir -p build-tsan/reports
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ignore_noninstrumented_modules=1 \
suppressions=$PWD/tests/tsan/suppressions.txt log_path=$PWD/build-tsan/reports/tsan"
for t in flashdraft_tsan_test flashdraft_common_test flashdraft_coordinator_test flashdraft_cli_test \
  flashdraft_feeder_test; do
  OMP_NUM_THREADS=1 "build-tsan/bin/$t" --gtest_brief=1
done
# The multi-process tests: workers and coordinator are the TSan binaries of build-tsan/bin. (The
# test of a worker with another BLAS kernel is left out: it alone takes ~10 min under TSan.)
(cd build-tsan && OMP_NUM_THREADS=1 ctest --output-on-failure --timeout 1200 -j 2 \
  -R '^(DistributedTest|WorldSizeInvarianceTest|ElasticTest\.KilledInside)' \
  -E 'AWorkerOfAnotherBlasKernelIsRefusedByName')
if compgen -G 'build-tsan/reports/*' >/dev/null; then
  cat build-tsan/reports/* | head -200
  echo "ThreadSanitizer: $(ls build-tsan/reports | wc -l) report file(s) in build-tsan/reports/"
  exit 1
fi
unset TSAN_OPTIONS
echo "ThreadSanitizer: no reports"

scripts/build.sh
# clang's thread-safety analysis (-Werror=thread-safety) over every translation unit (about 2-3 min
# on 2 cores with precompiled headers).
scripts/thread_safety_check.sh
# The GPU path (docs/GPU.md) is compiled wherever /usr/local/cuda has NCCL; its GPU tests skip here.
if grep -q "^FLASHDRAFT_NCCL_INCLUDE\|^NCCL_INCLUDE_DIR:PATH=/" build/CMakeCache.txt; then
  echo "GPU path: compiled against $(sed -n 's/^NCCL_INCLUDE_DIR:PATH=//p' build/CMakeCache.txt)" \
    "(tests that need a GPU skip and say so)"
else
  echo "GPU path: not compiled (no NCCL in /usr/local/cuda; -DFLASHDRAFT_WITH_CUDA=ON with NCCL_ROOT)"
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
cd build && ctest --output-on-failure --timeout 900 -j 2
