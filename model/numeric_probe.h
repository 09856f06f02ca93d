// The numeric environment of this process as LibTorch and the BLAS it loaded see it
// (common/numeric_env.h): logged at start, in the worker's --probe and Join, in /metrics and in
// checkpoints.
#pragma once

#include <string>

#include "common/numeric_env.h"

namespace flashdraft {

// `gpu`: the model of the GPU this process has ("" without one); `on_gpu`: whether it computes
// there (device "cuda <gpu>") or on the CPU (device "cpu").
NumericEnv ProbeNumericEnv(const std::string& gpu = "", bool on_gpu = false);

// The job's thread count (train.intra_op_threads) for everything this process computes: LibTorch's
// intra-op threads and OpenBLAS's. Some CPU reductions and products split their sums by thread
// count, so each process of a job sets both to the job's value rather than to its machine's (or
// its container's) core count. Call it before the process's computing threads start: OpenBLAS's
// count is not meant to change under a BLAS call in flight.
void PinComputeThreads(int threads);

}  // namespace flashdraft
