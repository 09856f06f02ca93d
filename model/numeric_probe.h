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

}  // namespace flashdraft
